"""The clean runtime an evaluator can ask for: prepared in init next to the session's, handed to the evaluator in
postrun, torn down with the session's (or by the reconciler when a teardown was interrupted)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from polar.contract.task_request import RuntimeSpec, TaskRequest
from polar.evaluators import Evaluation, EvaluationContext
from polar.runtimes import EVALUATOR_ROLE, create_runtime
from polar.services import Services
from polar.stages.reconciler import reconcile
from polar.storage.models import Session
from tests.polar.stages.test_stages import STAGE_FUNCTIONS, drain, sessions
from tests.processes import session_dirs
from tests.stage_calls import command_task, domain_services, submit_tasks

CLEAN_ROOM = f"{__name__}:CleanRoom"
PREPARE = {"prepare": [{"run": "echo pristine > state.txt"}]}


class CleanRoom:
    """Rewards 1.0 when the clean runtime still holds the prepared file the harness overwrote in its own."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.config = config

    def fresh_runtime(self, task: TaskRequest) -> RuntimeSpec | None:
        if self.config.get("explode"):
            raise RuntimeError("cannot decide")
        return RuntimeSpec.model_validate(self.config["runtime"]) if "runtime" in self.config else task.runtime

    def evaluate(self, context: EvaluationContext) -> Evaluation:
        assert context.runtime is not None and context.fresh_runtime is not None
        mine = (context.runtime.session_dir / "work" / "state.txt").read_text()
        clean = (context.fresh_runtime.session_dir / "work" / "state.txt").read_text()
        return Evaluation(reward=float(clean == "pristine\n" != mine), details={"mine": mine, "clean": clean})


@pytest.fixture
def services(database_url: str, tmp_path: Path) -> Services:
    return domain_services(database_url, tmp_path, ready_buffer=4, plugin_modules=("tests.polar.stages",))


def _task(**evaluator_config: Any) -> dict[str, Any]:
    return command_task(
        "t", "echo tampered > state.txt", runtime=PREPARE, evaluator={"name": CLEAN_ROOM, "config": evaluator_config}
    )


def _dirs(services: Services, session: Session) -> list[Path]:
    """The session's own directory, then its clean runtime's."""
    found = session_dirs(services.config.work_root, session.id)
    return sorted(found, key=lambda path: f"-{EVALUATOR_ROLE}" in path.name)


def test_init_prepares_a_clean_runtime_that_postrun_hands_over_and_removes(services: Services) -> None:
    submit_tasks(services, _task())
    stage, session_id = services.dispatcher.sent.pop(0)  # type: ignore[attr-defined]
    STAGE_FUNCTIONS[stage](services, session_id)  # init only
    (session,) = sessions(services)
    assert session.state == "ready" and session.evaluator_runtime_handle is not None
    session_dir, clean_dir = _dirs(services, session)
    assert (clean_dir / "work" / "state.txt").read_text() == "pristine\n"
    assert [session_dir, clean_dir] == [
        Path(h["root"]) for h in (session.runtime_handle, session.evaluator_runtime_handle)
    ]

    drain(services)
    (session,) = sessions(services)
    assert (session.state, session.reward) == ("completed", 1.0), session.error
    assert session.evaluation == {"mine": "tampered\n", "clean": "pristine\n"}
    assert session.runtime_handle is None and session.evaluator_runtime_handle is None
    assert not session_dir.exists() and not clean_dir.exists()


def test_a_failing_clean_runtime_prepare_fails_the_session_and_removes_both(services: Services) -> None:
    submit_tasks(services, _task(runtime={"prepare": [{"run": "echo broken >&2; exit 4"}]}))
    drain(services)
    attempts = sessions(services)
    # Preparation failed before the harness started: the policy never ran, so no score; each attempt is retried.
    assert [(s.state, s.outcome, s.outcome_class, s.reward) for s in attempts] == [
        ("failed", "prepare_failed", "infrastructure", None)
    ] * 3
    assert all("evaluator runtime prepare step 0" in (s.error or "") and "broken" in (s.error or "") for s in attempts)
    assert all(_dirs(services, session) == [] for session in attempts)


def test_an_evaluator_that_raises_deciding_its_runtime_makes_the_attempt_unscorable(services: Services) -> None:
    # The evaluator's own code failed, not the task: each attempt is retried as an infrastructure loss.
    submit_tasks(services, _task(explode=True))
    drain(services)
    attempts = sessions(services)
    assert [(s.state, s.outcome, s.outcome_class, s.reward) for s in attempts] == [
        ("failed", "unscorable", "infrastructure", None)
    ] * 3
    assert all("cannot decide" in (s.error or "") and s.evaluator_runtime_handle is None for s in attempts)


def test_the_reconciler_removes_a_leaked_clean_runtime(database_url: str, tmp_path: Path) -> None:
    services = domain_services(database_url, tmp_path, stale_after_s=0.0, plugin_modules=("tests.polar.stages",))
    submit_tasks(services, command_task("t", "true"))
    drain(services)
    (session,) = sessions(services)
    leaked = create_runtime(session.id, RuntimeSpec(), services.config, EVALUATOR_ROLE)
    with services.db.unit() as db:
        db.execute(sa.update(Session).where(Session.id == session.id).values(evaluator_runtime_handle=leaked.handle))
    assert leaked.session_dir.exists()
    done = reconcile(services)
    assert done["torn_down"] == 1
    assert not leaked.session_dir.exists()
    (session,) = sessions(services)
    assert session.evaluator_runtime_handle is None
