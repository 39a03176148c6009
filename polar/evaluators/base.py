"""The evaluator contract: a finished session in, a reward (and details worth storing) out.

An evaluator is any class built from its task's ``evaluator.config`` (raise ``ValueError`` there for a bad
config: the batch is refused with a 400) with an ``evaluate(context)`` method. One that must not trust the
session's own runtime (the harness may have changed the tests or the environment) also defines
``fresh_runtime(task)``: the runtime spec of a second, clean runtime, which ``init`` prepares next to the session's
(same prepare steps, before the harness starts) and ``postrun`` hands over as ``context.fresh_runtime``.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict

from polar.contract.states import Outcome
from polar.contract.task_request import RuntimeSpec, TaskRequest
from polar.reconstruction.base import CapturedCall, TrajectoryData
from polar.runtimes.base import Runtime
from polar.runtimes.session_files import read_output


@dataclass(frozen=True)
class EvaluationContext:
    session_id: uuid.UUID
    task: TaskRequest
    outcome: Outcome
    exit_code: int | None
    # The session's runtime after the harness (its processes killed, its files as the harness left them).
    runtime: Runtime | None
    calls: Sequence[CapturedCall]
    trajectories: Sequence[TrajectoryData]
    remaining_s: float
    # The clean runtime prepared in init, for evaluators that define ``fresh_runtime``.
    fresh_runtime: Runtime | None = None
    # The text of the model's last answer (the main chain's last answered call's assistant message, never a side
    # call's: ``polar.reconstruction.main_chain``), if there was one.
    final_message: str | None = None

    @property
    def harness_output(self) -> str:
        """What the harness printed (stdout and stderr), read from the session's log (its end, if it is huge)."""
        if self.runtime is None:
            return ""
        try:  # the harness may have made it a link or a FIFO: UnsafePath, never read
            return read_output(self.runtime.session_dir, "logs/harness.log")
        except OSError:
            return ""


@dataclass(frozen=True)
class Evaluation:
    reward: float
    trajectory_rewards: Sequence[float] | None = None
    details: Mapping[str, Any] = field(default_factory=dict)


class Evaluator(Protocol):
    def __init__(self, config: Mapping[str, Any]) -> None: ...

    def evaluate(self, context: EvaluationContext) -> Evaluation:
        """Score the session; raise to mark it failed (its trajectories are kept)."""
        ...


def fresh_runtime_spec(evaluator: Evaluator, task: TaskRequest) -> RuntimeSpec | None:
    """The clean runtime ``evaluator`` wants prepared for ``task`` in init, or None (it uses the session's)."""
    wants = getattr(evaluator, "fresh_runtime", None)
    return wants(task) if callable(wants) else None


class EvaluatorConfig(BaseModel):
    """Base of the built-in evaluators' configs: unknown keys are refused, so a typo is a 400, not a silent
    default."""

    model_config = ConfigDict(extra="forbid", frozen=True)
