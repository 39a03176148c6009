"""The evaluator contract: a finished session in, a reward (and details worth storing) out."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from polar.reconstruction.base import CapturedCall, TrajectoryData
from polar.runtimes.base import Runtime
from polar.states import Outcome
from polar.task_request import TaskRequest


@dataclass(frozen=True)
class EvaluationContext:
    session_id: uuid.UUID
    task: TaskRequest
    outcome: Outcome
    exit_code: int | None
    runtime: Runtime | None
    calls: Sequence[CapturedCall]
    trajectories: Sequence[TrajectoryData]
    remaining_s: float


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
