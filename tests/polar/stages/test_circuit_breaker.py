"""A batch's circuit breaker on the stage functions and a real Postgres: a batch whose every attempt is lost to the
infrastructure (its evaluator's runtime is gone) stops admitting after ``max_consecutive_infra_losses`` attempts in
a row, its unstarted sessions cancelled, and says why in its status; a task outcome between losses resets the
streak; a batch without the bound burns every attempt as before."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from polar.contract.dispatch import Stage
from polar.contract.task_request import parse_batch_request
from polar.lifecycle.batches import batch_status, request_hash, submit_batch
from polar.services import Services
from polar.storage.models import Session
from polar.storage.serialization import batch_json
from tests.polar.training.test_feed import add_call
from tests.stage_calls import command_task, domain_services, stage_functions

LOST = {"name": "tests.e2e.evaluator_plugins.broken:RuntimeGone"}  # the infrastructure's fault, every time


@pytest.fixture
def services(database_url: str, tmp_path: Path) -> Services:
    return domain_services(database_url, tmp_path, ready_buffer=2, plugin_modules=("tests.e2e",))


def run_all(services: Services, postrun_first: bool = False) -> None:
    """Every queued stage to the end, a model call answered in each run (so a loss is the infrastructure's); with
    ``postrun_first``, a session that has run is finished before the next one runs."""
    functions, sent = stage_functions(), services.dispatcher.sent  # type: ignore[attr-defined]
    while sent:
        index = next((i for i, (stage, _) in enumerate(sent) if stage is Stage.POSTRUN), 0) if postrun_first else 0
        stage, session_id = sent.pop(index)
        if stage is Stage.POSTRUN:
            add_call(services, session_id)
        functions[stage](services, session_id)


def submit(services: Services, body: dict[str, Any]) -> uuid.UUID:
    return submit_batch(services, parse_batch_request(body), request_hash(body)).batch_id


def attempts(services: Services, batch_id: uuid.UUID) -> dict[str, int]:
    with services.db.engine.connect() as connection:
        rows = connection.execute(sa.select(Session.outcome_class, sa.func.count()).where(
            Session.batch_id == batch_id).group_by(Session.outcome_class)).all()  # fmt: skip
    return {str(cls): int(n) for cls, n in rows}


def test_a_batch_of_always_lost_attempts_stops_admitting_after_n_losses(services: Services) -> None:
    tasks = [command_task(f"t{i}", "true", evaluator=LOST, max_attempts=3) for i in range(10)]
    batch_id = submit(services, {"max_consecutive_infra_losses": 3, "tasks": tasks})
    run_all(services)
    status = batch_status(services, batch_id)
    shown = batch_json(status["batch"], status["status"], status["counts"], status["attempts"])
    assert status["status"] == "finished"
    assert "3 attempts in a row were lost to the infrastructure" in str(shown["halted_reason"])
    assert shown["halted_at"] is not None
    ran = attempts(services, batch_id)
    # The third loss halted it; only what was already admitted (the READY buffer's 2, the run slots') ran after:
    # never the 30 attempts of 10 samples, and every sample settled (lost, or cancelled unstarted).
    admitted = 2 + services.config.run_concurrency
    assert 3 <= ran["infrastructure"] <= 3 + admitted < 30 and set(ran) == {"infrastructure", "cancelled"}
    with services.db.engine.connect() as connection:
        latest = connection.scalar(sa.select(sa.func.count()).where(Session.batch_id == batch_id,
                                                                   Session.retried_as.is_(None)))  # fmt: skip
    assert latest == 10
    with services.db.engine.connect() as connection:
        events = connection.execute(sa.text(
            "SELECT count(*) FROM session_events e JOIN sessions s ON s.id = e.session_id "
            "WHERE s.batch_id = :b AND e.detail LIKE 'batch halted: %'"), {"b": batch_id}).scalar_one()  # fmt: skip
    assert events == ran["cancelled"] > 0


def test_a_task_outcome_resets_the_streak_and_no_bound_means_no_halt(services: Services) -> None:
    lost = [command_task(f"l{i}", "true", evaluator=LOST, max_attempts=1) for i in range(2)]
    scored = command_task("ok", "true")
    # Two losses, a scored sample, two losses: never three in a row (the buffer of 2 runs them in this order).
    batch_id = submit(services, {"max_consecutive_infra_losses": 3, "tasks": [*lost, scored, *lost[:1],
                                                                            {**lost[1], "task_id": "l3"}]})  # fmt: skip
    run_all(services)
    status = batch_status(services, batch_id)
    assert status["batch"].halted_at is None and attempts(services, batch_id) == {"infrastructure": 4, "task": 1}
    unbounded = submit(services, {"tasks": [command_task("u", "true", evaluator=LOST, max_attempts=4)]})
    run_all(services)
    assert attempts(services, unbounded) == {"infrastructure": 4}
