"""Where a session's time went (``GET /v1/sessions/<id>``'s ``time``): each part from the stage stamps, the answered
calls' summed latency and the budget a pause gave back, on the stage functions and a real Postgres."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

from polar.lifecycle.sessions import get_session
from polar.services import Services
from polar.storage.models import ModelCall, Session
from tests.polar.stages.test_circuit_breaker import run_all, submit
from tests.stage_calls import command_task, domain_services


@pytest.fixture
def services(database_url: str, tmp_path: Path) -> Services:
    return domain_services(database_url, tmp_path)


def test_a_sessions_time_adds_up_from_its_stamps_calls_and_pauses(services: Services) -> None:
    batch_id = submit(services, {"tasks": [command_task("t", "sleep 0.3", timeout_seconds=60)]})
    run_all(services)
    with services.db.unit() as db:
        session_id = db.scalar(sa.select(Session.id).where(Session.batch_id == batch_id))
        db.execute(sa.update(ModelCall).where(ModelCall.session_id == session_id).values(latency_ms=100.0))
        # A pause that held it gave 5 s of budget back (polar.lifecycle.budget moves the deadline out).
        db.execute(sa.update(Session).where(Session.id == session_id)
                   .values(deadline_at=Session.budget_started_at + timedelta(seconds=65)))  # fmt: skip
    assert session_id is not None
    time = get_session(services, session_id)["time"]
    assert time["harness_s"] is not None and time["harness_s"] >= 0.3  # the harness slept
    assert time["model_calls_s"] == pytest.approx(0.1)
    assert time["between_calls_s"] == pytest.approx(time["harness_s"] - 0.1)
    assert time["paused_s"] == pytest.approx(5.0)
    parts = ("queued_s", "init_s", "ready_s", "engine_gate_s", "harness_s", "postrun_s")
    assert all(time[name] is not None and time[name] >= 0 for name in parts)
    assert sum(time[name] for name in parts) <= time["total_s"] + 0.5  # the stages, in order, within the whole
