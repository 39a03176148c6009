"""Evaluators that fail, for the classification of how an attempt ends: one whose runtime breaks under it (the
infrastructure's fault), one with a bug of its own and one whose reward is no number (the attempt is unscorable),
and one that takes its worker down every time (postrun must not retry it forever)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from polar.errors import RuntimeFailure
from polar.evaluators.base import Evaluation, EvaluationContext


class RuntimeGone:
    def __init__(self, config: Mapping[str, Any]) -> None:
        pass

    def evaluate(self, context: EvaluationContext) -> Evaluation:
        raise RuntimeFailure("the evaluator's container is gone")


class Buggy:
    def __init__(self, config: Mapping[str, Any]) -> None:
        pass

    def evaluate(self, context: EvaluationContext) -> Evaluation:
        raise ValueError("an evaluator bug")


class NotANumber:
    def __init__(self, config: Mapping[str, Any]) -> None:
        pass

    def evaluate(self, context: EvaluationContext) -> Evaluation:
        return Evaluation(reward=float("nan"))


class Dies:
    """Takes its worker down with it every time (as a process killed mid-evaluation would: nothing is caught)."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        pass

    def evaluate(self, context: EvaluationContext) -> Evaluation:
        raise SystemExit("the evaluator took its worker down")
