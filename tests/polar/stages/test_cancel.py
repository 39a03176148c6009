"""Cancelling a batch on the domain functions: unstarted sessions end at once, prepared ones via postrun."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import sqlalchemy as sa

from polar.batches.cancel import cancel_batch
from polar.contract.dispatch import Stage
from polar.stages.postrun import postrun_session
from polar.storage.database import Database
from polar.storage.locks import FEED, exclusive
from polar.storage.models import Batch, Session, SessionEvent
from tests.processes import wait_until
from tests.stage_calls import command_task, deliver_all, domain_services, record_call, stage_functions, submit_tasks


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


_LOCK_WAITS = sa.text(
    "SELECT wait_event FROM pg_stat_activity"
    " WHERE datname = current_database() AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
)


def _lock_waits(db: Database) -> list[str]:
    """What this test database's other connections are waiting for (``advisory``: a lock like the feed's; a row:
    ``transactionid`` or ``tuple``)."""
    with db.unit() as session:
        return list(session.scalars(_LOCK_WAITS))


def _started(work: Callable[[], object], failures: list[BaseException]) -> threading.Thread:
    def run() -> None:
        try:
            work()
        except BaseException as exc:  # re-raised by the test, not lost in the thread
            failures.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_an_attempt_lost_as_its_batch_is_cancelled_starts_no_next_one(database_url: str, tmp_path: Path) -> None:
    """Audit G21: postrun read the batch's cancel flag without a lock. A cancel that had locked its batch but not
    committed was not seen, and the lost attempt's next one was inserted after the cancel's UPDATE of the pending
    sessions: a pending attempt in a cancelled batch. The flag is read under a lock that waits for the cancel's.
    The feed lock, held here, stops the cancel half-way (its batch row locked) while postrun comes to the flag."""
    services = domain_services(database_url, tmp_path)
    batch_id = submit_tasks(services, command_task("t", "exit 1"))
    deliver_all(services, until=lambda stage, _: stage is Stage.POSTRUN)
    stage, session_id = services.dispatcher.sent.pop(0)  # type: ignore[attr-defined]
    assert stage is Stage.POSTRUN
    record_call(services, session_id, status=502)  # the engine failed its call: the attempt is lost, to be retried
    observer, failures = Database(database_url), []
    try:
        with observer.unit() as held:
            exclusive(held, FEED)
            cancelling = _started(lambda: cancel_batch(services, batch_id), failures)
            wait_until(lambda: _lock_waits(observer) == ["advisory"], 30, "the cancel to wait for the feed lock")
            ending = _started(lambda: postrun_session(services, session_id), failures)
            wait_until(lambda: len(_lock_waits(observer)) == 2, 30, "postrun to wait on the cancel")
        cancelling.join(30)
        ending.join(30)
    finally:
        observer.dispose()
    assert not failures, failures
    with services.db.unit() as db:
        rows = db.execute(sa.select(Session.state, Session.outcome, Session.retried_as)).all()
    assert [tuple(row) for row in rows] == [("failed", "engine_failed", None)]  # and no pending attempt after it
