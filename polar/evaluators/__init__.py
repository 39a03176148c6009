"""Evaluators turn a finished session into a reward.

A task names its evaluator by one of: a built-in name (``EVALUATORS``), the name of an entry point in the
``polar.evaluators`` group of an installed package, or an import path ``module:Class`` whose module the operator
allows (``POLAR_PLUGIN_MODULES``, ``polar.codec.import_path``): built-ins and installed packages are the operator's
choice, a request body is not. Submission builds the evaluator once from its config, so an unknown name, a path
outside the allow-list or a bad config is refused with a 400 naming the field; the workers check the allow-list
again when they load it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from importlib.metadata import EntryPoint, entry_points
from typing import Any

import pydantic

from polar.codec.import_path import IMPORT_PATH, LazyRegistry, import_object
from polar.contract.task_request import EvaluatorSpec, first_error
from polar.errors import PluginNotAllowed, ValidationError
from polar.evaluators.base import Evaluation, EvaluationContext, Evaluator, EvaluatorConfig, fresh_runtime_spec

EvaluatorFactory = Callable[[Mapping[str, Any]], Evaluator]

# The built-ins, each imported when a task first names it.
EVALUATORS: LazyRegistry[EvaluatorFactory] = LazyRegistry(
    {
        "session_completion": "polar.evaluators.session_completion:SessionCompletion",
        "test_on_output": "polar.evaluators.test_on_output:TestOnOutput",
        "reward_file": "polar.evaluators.reward_file:RewardFile",
        "swebench": "polar.evaluators.swebench:SWEBench",
        "harbor": "polar.evaluators.harbor:Harbor",
    }
)
ENTRY_POINT_GROUP = "polar.evaluators"

__all__ = [
    "ENTRY_POINT_GROUP",
    "EVALUATORS",
    "Evaluation",
    "EvaluationContext",
    "Evaluator",
    "EvaluatorConfig",
    "check_evaluator",
    "fresh_runtime_spec",
    "load_evaluator",
]


class _Unknown(LookupError):
    """No evaluator by that name."""


@functools.cache
def _entry_points() -> dict[str, EntryPoint]:
    # Read once per process: installing a package that adds evaluators takes a restart, as for any plugin.
    return {point.name: point for point in entry_points(group=ENTRY_POINT_GROUP)}


def _factory(name: str, plugin_modules: Sequence[str]) -> EvaluatorFactory:
    if name in EVALUATORS:
        return EVALUATORS[name]
    point = _entry_points().get(name)
    if point is not None:
        return point.load()  # type: ignore[no-any-return]
    if IMPORT_PATH.fullmatch(name):
        return import_object(name, plugin_modules)  # type: ignore[no-any-return]
    raise _Unknown(name)


def check_evaluator(spec: EvaluatorSpec, field: str, plugin_modules: Sequence[str] = ()) -> None:
    """Refuse a task whose evaluator cannot be found, is an import path outside ``plugin_modules``, or does not
    accept its config."""
    try:
        factory = _factory(spec.name, plugin_modules)
    except _Unknown:
        known = ", ".join(sorted({*EVALUATORS, *_entry_points()}))
        raise ValidationError(
            f"{field}.name: unknown evaluator {spec.name!r} (known: {known}; or 'module:Class')", field=f"{field}.name"
        ) from None
    except PluginNotAllowed as exc:
        raise PluginNotAllowed(f"{field}.name: {exc}", field=f"{field}.name") from exc
    except (ImportError, AttributeError) as exc:
        raise ValidationError(f"{field}.name: cannot import {spec.name!r}: {exc}", field=f"{field}.name") from exc
    try:
        factory(spec.config)
    except pydantic.ValidationError as exc:
        raise first_error(exc, f"{field}.config") from exc
    except (ValueError, TypeError, KeyError) as exc:
        raise ValidationError(f"{field}.config: {exc}", field=f"{field}.config") from exc


def load_evaluator(spec: EvaluatorSpec, plugin_modules: Sequence[str] = ()) -> Evaluator:
    """The task's evaluator, built from its config; an import path outside ``plugin_modules`` is refused (raises
    ``PluginNotAllowed``) even if it was allowed when the task was submitted."""
    return _factory(spec.name, plugin_modules)(spec.config)
