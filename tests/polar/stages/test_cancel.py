"""Cancelling a batch on the domain functions: unstarted sessions end at once, prepared ones via postrun."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa

from polar.batches.cancel import cancel_batch
from polar.storage.models import Batch, Session, SessionEvent
from tests.stage_calls import command_task, domain_services, stage_functions, submit_tasks


def test_cancel_ends_every_session(database_url: str, tmp_path: Path) -> None:
    services = domain_services(database_url, tmp_path, ready_buffer=2)
    batch_id = submit_tasks(services, command_task("t", "true", samples=4))
    result = cancel_batch(services, batch_id)
    assert (result.cancelled, result.stopping) == (2, 2)  # two pending, two admitted into init
    functions = stage_functions()
    while services.dispatcher.sent:  # type: ignore[attr-defined]
        stage, session_id = services.dispatcher.sent.pop(0)  # type: ignore[attr-defined]
        functions[stage](services, session_id)
    with services.db.unit() as db:
        states = db.scalars(sa.select(Session.state)).all()
        batch = db.get(Batch, batch_id)
        assert batch is not None and batch.finished_at is not None and batch.cancel_requested_at is not None
        assert db.scalar(sa.select(sa.func.count()).where(Session.feed_seq.is_not(None))) == 4
    assert states == ["cancelled"] * 4
    again = cancel_batch(services, batch_id)
    assert (again.cancelled, again.stopping) == (0, 0)


def test_cancelling_many_unstarted_sessions_is_complete(database_url: str, tmp_path: Path) -> None:
    services = domain_services(database_url, tmp_path, ready_buffer=0)
    batch_id = submit_tasks(services, *(command_task(f"t{i}", "true", samples=50) for i in range(6)))
    result = cancel_batch(services, batch_id)
    assert (result.cancelled, result.stopping) == (300, 0)
    with services.db.unit() as db:
        rows = db.execute(sa.select(Session.state, Session.outcome_class, Session.feed_seq)).all()
        events = db.execute(
            sa.select(SessionEvent.from_state, SessionEvent.to_state, SessionEvent.node, sa.func.count()).group_by(
                SessionEvent.from_state, SessionEvent.to_state, SessionEvent.node
            )
        ).all()
    assert {(r.state, r.outcome_class) for r in rows} == {("cancelled", "cancelled")}
    assert sorted(r.feed_seq for r in rows) == list(range(1, 301))  # each settles its group once, served nowhere
    assert sorted(tuple(e) for e in events if e.from_state) == [("pending", "cancelled", services.config.node, 300)]
