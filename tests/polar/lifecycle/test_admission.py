"""Admission by priority on the domain functions and a real Postgres: a task's ``priority`` (0-100, a batch's for
its tasks unless they name their own) goes first; within one priority, retries, then the oldest; what was admitted
is never put back. The order is one partial index's (migration 0024): Postgres reads ``room`` rows of it."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from polar.contract.task_request import parse_batch_request
from polar.errors import ValidationError
from polar.lifecycle.admission import ADMISSION_ORDER, admit
from polar.lifecycle.batches import request_hash, submit_batch
from polar.services import Services
from polar.storage.models import Session
from tests.stage_calls import command_task, domain_services

BUFFER = 4


@pytest.fixture
def services(database_url: str, tmp_path: Path) -> Iterator[Services]:
    services = domain_services(database_url, tmp_path, ready_buffer=BUFFER)
    yield services
    services.db.dispose()


def submit(services: Services, body: dict[str, Any]) -> uuid.UUID:
    return submit_batch(services, parse_batch_request(body), request_hash(body)).batch_id


def admitted(services: Services, batch_id: uuid.UUID) -> int:
    with services.db.engine.connect() as connection:
        query = sa.select(sa.func.count()).where(Session.batch_id == batch_id, Session.state != "pending")
        return int(connection.scalar(query) or 0)


def drain(services: Services) -> None:
    """The READY buffer empties: its sessions went on (here: straight to an end)."""
    with services.db.engine.begin() as connection:
        connection.execute(sa.update(Session).where(Session.state == "init").values(state="completed"))


def test_a_higher_priority_batch_is_admitted_before_any_more_of_an_earlier_one(services: Services) -> None:
    low = submit(services, {"priority": 10, "tasks": [command_task("low", "true", samples=200)]})
    assert admitted(services, low) == BUFFER  # the buffer filled at submission
    high = submit(services, {"tasks": [command_task("high", "true", samples=10, priority=90)]})
    assert admitted(services, high) == 0  # running (here: buffered) sessions are not preempted
    passes = 0
    while admitted(services, high) < 10:
        waiting = 10 - admitted(services, high)
        drain(services)
        admit(services)
        passes += 1
        # The lower batch gets only the room the higher one's sessions leave.
        assert admitted(services, low) == BUFFER + max(0, BUFFER - waiting), passes
    assert passes == 3  # 4 + 4 + 2 of the higher batch; the last pass's other 2 places went to the lower batch
    with services.db.engine.connect() as connection:
        priorities = dict(connection.execute(sa.select(Session.batch_id, Session.priority).distinct()).all())
    assert priorities == {low: 10, high: 90}


def test_priority_defaults_and_bounds(services: Services) -> None:
    tasks = [command_task("a", "true"), command_task("b", "true", priority=5)]
    batch = parse_batch_request({"priority": 70, "tasks": tasks})
    assert [t.priority for t in batch.tasks] == [70, 5]
    assert parse_batch_request({"tasks": [command_task("a", "true")]}).tasks[0].priority == 50
    for bad in ({"priority": 101, "tasks": [command_task("a", "true")]},
                {"tasks": [command_task("a", "true", priority=-1)]}):  # fmt: skip
        with pytest.raises(ValidationError, match="priority"):
            parse_batch_request(bad)


def test_an_admission_pass_reads_the_index_not_every_pending_session(services: Services) -> None:
    submit(services, {"tasks": [command_task("many", "true", samples=2000)]})
    query = sa.select(Session.id).where(Session.state == "pending").order_by(*ADMISSION_ORDER).limit(BUFFER)
    with services.db.engine.begin() as connection:
        connection.execute(sa.text("ANALYZE sessions"))
        sql = str(query.compile(dialect=connection.dialect, compile_kwargs={"literal_binds": True}))
        plan = str(connection.execute(sa.text(f"EXPLAIN (FORMAT JSON) {sql}")).scalar_one())
    assert "ix_sessions_pending_admission" in plan and "Sort" not in plan, plan
