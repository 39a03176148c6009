"""``session_completion``: reward 1.0 when the harness exited 0 within its time, else 0.0."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from polar.contract.states import Outcome
from polar.evaluators.base import Evaluation, EvaluationContext


class SessionCompletion:
    def __init__(self, config: Mapping[str, Any]) -> None:
        self.config = config

    def evaluate(self, context: EvaluationContext) -> Evaluation:
        finished = context.outcome is Outcome.EXITED and context.exit_code == 0
        return Evaluation(
            reward=1.0 if finished else 0.0,
            details={"outcome": context.outcome.value, "exit_code": context.exit_code},
        )
