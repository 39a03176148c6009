"""Which samples have settled, read on Postgres: a settled session comes with its side calls."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from polar.gym.settlement import settled_samples
from polar.services import Services
from polar.storage.models import Session, Trajectory
from tests.polar.storage.test_prompts import running_session
from tests.stage_calls import domain_services


@pytest.fixture
def services(database_url: str, tmp_path: Path) -> Iterator[Services]:
    services = domain_services(database_url, tmp_path)
    yield services
    services.db.dispose()


def test_a_settled_session_comes_with_the_calls_outside_its_main_chain(services: Services) -> None:
    session_id, side = running_session(services), str(uuid.uuid4())
    with services.db.unit() as db:
        db.execute(sa.update(Session).where(Session.id == session_id).values(state="completed", outcome_class="task"))
        for position, (calls, main) in enumerate([([str(uuid.uuid4())], True), ([side], False)]):
            db.add(Trajectory(session_id=session_id, position=position, reconstruction="prefix_merging",
                              token_ids=[1], loss_mask=[1], logprobs=[0.0], call_ids=calls, main=main))  # fmt: skip
        sample = db.execute(sa.select(Session.batch_id, Session.task_position).where(Session.id == session_id)).one()
    (settled,) = settled_samples(services, [tuple(sample)]).values()
    assert settled.session_id == session_id and settled.side_calls == frozenset({side})


def test_a_poll_reads_only_the_samples_it_answers(services: Services) -> None:
    from tests.stage_calls import command_task, submit_tasks

    batch_id = submit_tasks(services, *(command_task(f"t{i}", "true") for i in range(50)))
    with services.db.unit() as db:  # every sample settled, with an evaluation a poll must not drag along
        db.execute(sa.update(Session).where(Session.batch_id == batch_id)
                   .values(state="completed", outcome_class="task", evaluation={"log_tail": "x" * 10_000}))  # fmt: skip
    read: list[int] = []

    def rows(conn: object, cursor: object, statement: str, *args: object) -> None:
        if "FROM sessions" in statement and "evaluation" in statement:
            read.append(getattr(cursor, "rowcount", -1))

    sa.event.listen(services.db.engine, "after_cursor_execute", rows)
    try:
        found = settled_samples(services, [(batch_id, 7), (batch_id, 42)])
    finally:
        sa.event.remove(services.db.engine, "after_cursor_execute", rows)
    assert sorted(position for _, position in found) == [7, 42]
    assert read == [2]  # the two rows answered, not the batch's 50 settled sessions
