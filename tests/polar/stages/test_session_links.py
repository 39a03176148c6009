"""Through the stages: a link planted in the session directory makes the step that would follow it fail, with a
message naming the path; nothing outside the session changes. Planted by a prepare step, the harness never starts
(preparation's failure: the infrastructure's); planted by the harness, it is the policy's failure."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa

from polar.storage.models import Session
from tests.outside import Outside
from tests.stage_calls import calls_before_postrun, command_task, deliver_all, domain_services, submit_tasks


def _only(database_url: str, tmp_path: Path, task: dict) -> Session:  # type: ignore[type-arg]
    services = domain_services(database_url, tmp_path / "work")
    submit_tasks(services, {**task, "max_attempts": 1})
    deliver_all(services, until=calls_before_postrun(services))  # a harness that ran asked the model once
    with services.db.unit() as db:
        return db.scalars(sa.select(Session)).one()


def test_a_prepare_step_that_links_the_harness_log_fails_the_session(database_url: str, tmp_path: Path) -> None:
    outside = Outside.make(tmp_path)
    plant = {"run": f"ln -s {outside.victim} ../logs/harness.log"}
    session = _only(database_url, tmp_path, command_task("t", "echo 'import os'", runtime={"prepare": [plant]}))
    outside.assert_unchanged()
    assert (session.state, session.outcome, session.outcome_class) == ("failed", "prepare_failed", "infrastructure")
    assert "logs/harness.log is a symbolic link" in (session.error or "")


def test_a_harness_that_links_the_evaluator_log_fails_its_evaluation(database_url: str, tmp_path: Path) -> None:
    outside = Outside.make(tmp_path)
    evaluator = {"name": "test_on_output", "config": {"command": "echo 'import os'"}}
    task = command_task("t", f"ln -s {outside.victim} ../logs/evaluator.log", evaluator=evaluator)
    session = _only(database_url, tmp_path, task)
    outside.assert_unchanged()
    # The work tampered with its judging: the policy's failure, scored the task's failure_reward (0.0), never None.
    assert (session.state, session.outcome_class, session.reward) == ("failed", "task", 0.0)
    assert "UnsafePath" in (session.error or "") and "logs/evaluator.log" in (session.error or "")
