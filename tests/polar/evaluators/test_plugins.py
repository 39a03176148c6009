"""Evaluators named by import path: only under the operator's ``POLAR_PLUGIN_MODULES``. A request body naming
``subprocess:Popen`` with a config that is its argv used to run that command inside the API process at
submission; now it is refused before anything is imported or built, and a worker refuses a stored task whose path
the allow-list no longer holds."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from polar.contract.task_request import EvaluatorSpec
from polar.errors import PluginNotAllowed
from polar.evaluators import check_evaluator
from polar.storage.models import Batch, Session
from tests.stage_calls import command_task, deliver_all, domain_services, submit_tasks


def popen(mark: Path) -> EvaluatorSpec:
    # Popen(config) iterates the dict: its keys become the argv.
    return EvaluatorSpec(name="subprocess:Popen", config={"/bin/sh": 0, "-c": 0, f"touch {mark}": 0})


def test_an_import_path_outside_the_allow_list_is_refused_and_never_run(tmp_path: Path) -> None:
    mark = tmp_path / "ran"
    with pytest.raises(PluginNotAllowed) as refused:
        check_evaluator(popen(mark), "tasks[0].evaluator", ("tests.e2e",))
    time.sleep(0.5)  # a started process would have touched it by now
    assert not mark.exists()
    assert refused.value.field == "tasks[0].evaluator.name"
    message = refused.value.message
    assert message.startswith("tasks[0].evaluator.name: 'subprocess:Popen' is not allowed")
    assert "POLAR_PLUGIN_MODULES" in message


def test_built_ins_need_no_allow_list_and_allowed_paths_load() -> None:
    check_evaluator(EvaluatorSpec(name="session_completion"), "tasks[0].evaluator")
    plugin = EvaluatorSpec(name="tests.e2e.evaluator_plugins.per_trajectory:PerTrajectory", config={"rewards": [1]})
    with pytest.raises(PluginNotAllowed):
        check_evaluator(plugin, "tasks[0].evaluator")
    check_evaluator(plugin, "tasks[0].evaluator", ("tests.e2e",))


def test_submission_stores_nothing(database_url: str, tmp_path: Path) -> None:
    services = domain_services(database_url, tmp_path / "work")
    mark = tmp_path / "ran"
    evaluator = {"name": "subprocess:Popen", "config": popen(mark).config}
    with pytest.raises(PluginNotAllowed):
        submit_tasks(services, command_task("fine", "true"), command_task("bad", "true", evaluator=evaluator))
    time.sleep(0.5)
    assert not mark.exists()
    with services.db.unit() as db:
        assert db.scalar(sa.select(sa.func.count()).select_from(Batch)) == 0


def test_a_worker_refuses_a_stored_path_the_allow_list_no_longer_holds(database_url: str, tmp_path: Path) -> None:
    plugin = {"name": "tests.e2e.evaluator_plugins.per_trajectory:PerTrajectory", "config": {"rewards": [1]}}
    allowed = domain_services(database_url, tmp_path / "work", plugin_modules=("tests.e2e",))
    submit_tasks(allowed, command_task("t", "true", evaluator=plugin))
    # The operator narrowed POLAR_PLUGIN_MODULES after the task was stored; the workers start with the new setting.
    narrowed = domain_services(database_url, tmp_path / "work")
    narrowed.dispatcher.sent.extend(allowed.dispatcher.sent)  # type: ignore[attr-defined]
    deliver_all(narrowed)
    with narrowed.db.unit() as db:
        sessions = db.scalars(sa.select(Session).order_by(Session.attempt)).all()
    # The evaluator cannot be loaded: nothing judged the work, so each attempt is unscorable (retried), never scored.
    assert [(s.state, s.outcome, s.reward) for s in sessions] == [("failed", "unscorable", None)] * 3
    for session in sessions:
        assert "is not allowed" in (session.error or "") and "POLAR_PLUGIN_MODULES" in (session.error or "")
