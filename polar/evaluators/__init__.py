"""Evaluators turn a finished session into a reward. Built-ins by name, or any ``module:Class``."""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Mapping
from typing import Any

from polar.errors import ValidationError
from polar.evaluators.base import Evaluation, EvaluationContext, Evaluator
from polar.evaluators.session_completion import SessionCompletion
from polar.task_request import EvaluatorSpec

EVALUATORS: dict[str, Callable[[Mapping[str, Any]], Evaluator]] = {"session_completion": SessionCompletion}

__all__ = ["EVALUATORS", "Evaluation", "EvaluationContext", "Evaluator", "check_evaluator", "load_evaluator"]

_IMPORT_PATH = re.compile(r"[\w.]+:[\w.]+")


def _import(path: str) -> Callable[[Mapping[str, Any]], Evaluator]:
    module_name, _, attribute = path.partition(":")
    target: Any = importlib.import_module(module_name)
    for part in attribute.split("."):
        target = getattr(target, part)
    return target  # type: ignore[no-any-return]


def check_evaluator(spec: EvaluatorSpec, field: str) -> None:
    if spec.name in EVALUATORS:
        return
    if not _IMPORT_PATH.fullmatch(spec.name):
        raise ValidationError(
            f"{field}.name: unknown evaluator {spec.name!r} (built-ins: {', '.join(sorted(EVALUATORS))}, "
            "or 'module:Class')",
            field=f"{field}.name",
        )
    try:
        _import(spec.name)
    except (ImportError, AttributeError) as exc:
        raise ValidationError(f"{field}.name: cannot import {spec.name!r}: {exc}", field=f"{field}.name") from exc


def load_evaluator(spec: EvaluatorSpec) -> Evaluator:
    factory = EVALUATORS.get(spec.name) or _import(spec.name)
    return factory(spec.config)
