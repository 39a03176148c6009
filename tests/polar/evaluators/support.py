"""What the evaluator tests share: a finished session to evaluate (a real local runtime, its work directory as a
harness left it, an optional clean runtime, and the ``EvaluationContext`` postrun would build), and the field a
bad config is refused for."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from polar.config import Config, load_config
from polar.contract.states import Outcome
from polar.contract.task_request import EvaluatorSpec, RuntimeSpec, task_from_json
from polar.errors import ValidationError
from polar.evaluators import EvaluationContext, check_evaluator
from polar.runtimes import EVALUATOR_ROLE, Runtime, create_runtime
from tests.stage_calls import command_task


@dataclass
class FinishedSession:
    config: Config
    session_id: uuid.UUID = field(default_factory=uuid.uuid4)
    runtime: Runtime = field(init=False)
    fresh: Runtime | None = None

    def __post_init__(self) -> None:
        self.runtime = create_runtime(self.session_id, RuntimeSpec(), self.config)

    @property
    def work(self) -> Path:
        return self.runtime.session_dir / "work"

    def write(self, name: str, text: str) -> Path:
        """A file the harness left in its work directory."""
        path = self.work / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path

    def printed(self, text: str) -> None:
        """What the harness printed (its log)."""
        (self.runtime.session_dir / "logs" / "harness.log").write_text(text)

    def clean_runtime(self) -> Runtime:
        """The clean runtime init would have prepared for an evaluator that asked for one."""
        self.fresh = create_runtime(self.session_id, RuntimeSpec(), self.config, EVALUATOR_ROLE)
        return self.fresh

    def context(self, final_message: str | None = None, **task: Any) -> EvaluationContext:
        return EvaluationContext(
            session_id=self.session_id,
            task=task_from_json(command_task("t", "true", **task)),
            outcome=Outcome.EXITED,
            exit_code=0,
            runtime=self.runtime,
            calls=[],
            trajectories=[],
            remaining_s=60.0,
            fresh_runtime=self.fresh,
            final_message=final_message,
        )


def finished_session(tmp_path: Path) -> FinishedSession:
    return FinishedSession(load_config({"POLAR_WORK_ROOT": str(tmp_path / "sessions")}, cwd=tmp_path))


def refused_field(name: str, config: dict[str, Any]) -> str:
    """Why a submission of evaluator ``name`` with ``config`` is refused: the 400's message, which starts with the
    field it names."""
    with pytest.raises(ValidationError) as refused:
        check_evaluator(EvaluatorSpec(name=name, config=config), "tasks[0].evaluator")
    assert refused.value.field is not None and refused.value.message.startswith(f"{refused.value.field}: ")
    return refused.value.message
