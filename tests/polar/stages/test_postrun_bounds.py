"""Postrun is bounded: one that dies every time is ended (trajectories kept, unscored) instead of being retried
forever, and what an evaluator reads of a session's output is bounded."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa

from polar.contract.dispatch import Stage
from polar.runtimes.session_files import read_output
from polar.stages.postrun import MAX_POSTRUN_CLAIMS
from polar.stages.reconciler import reconcile
from polar.storage.models import ModelCall, Session, Trajectory
from tests.stage_calls import command_task, deliver_all, domain_services, submit_tasks


def test_a_postrun_that_dies_every_time_is_ended(database_url: str, tmp_path: Path) -> None:
    services = domain_services(database_url, tmp_path, stale_after_s=1.0, plugin_modules=("tests.e2e",))
    evaluator = {"name": "tests.e2e.evaluator_plugins.broken:Dies"}
    submit_tasks(services, command_task("t", "true", evaluator=evaluator, max_attempts=1))
    deliver_all(services, until=lambda stage, _: stage is Stage.POSTRUN)
    with services.db.unit() as db:  # the harness made one answered call: a trajectory to keep
        session_id = db.scalar(sa.select(Session.id))
        db.add(ModelCall(session_id=session_id, seq=1, provider="openai_chat", prompt_token_ids=[1, 2],
                         completion_token_ids=[3], logprobs=[-0.1], status_code=200, latency_ms=1.0, request={},
                         normalized_request={"messages": []}, response={}))  # fmt: skip

    tries = 0
    while services.dispatcher.sent:  # type: ignore[attr-defined]
        tries += 1
        assert tries <= MAX_POSTRUN_CLAIMS + 1, "postrun is retried forever"
        try:
            deliver_all(services)
        except SystemExit:
            pass  # the worker died; its lease goes stale and the reconciler sends postrun again
        with services.db.unit() as db:  # a stale window later
            an_hour_ago = sa.func.now() - sa.text("interval '1 hour'")
            db.execute(sa.update(Session).values(heartbeat_at=an_hour_ago, stage_enqueued_at=an_hour_ago))
        reconcile(services)
    with services.db.unit() as db:
        session = db.scalars(sa.select(Session)).one()
        trajectories = db.scalar(sa.select(sa.func.count()).select_from(Trajectory))
    assert tries == MAX_POSTRUN_CLAIMS + 1
    assert (session.state, session.outcome, session.outcome_class) == ("failed", "error", "infrastructure")
    assert "postrun did not finish in 3 tries" in (session.error or "") and session.reward is None
    assert trajectories == 1


def test_reading_output_is_bounded(tmp_path: Path) -> None:
    log = tmp_path / "harness.log"
    log.write_bytes(b"x" * (3 * 1024 * 1024) + b"\nthe answer is 42\n")
    text = read_output(tmp_path, "harness.log", limit=1024 * 1024)
    assert text.startswith("[polar: the first 2097170 bytes of 3145746 were left out]\n")
    assert text.endswith("the answer is 42\n") and len(text) < 1024 * 1024 + 100
    small = tmp_path / "small.log"
    small.write_text("all of it")
    assert read_output(tmp_path, small) == "all of it"
    with pytest.raises(OSError):
        read_output(tmp_path, "missing.log")
