"""Runtimes: where sessions run. ``base`` is the interface; ``local`` a private directory on the host.

The registry maps the ``runtime.backend`` names of a TaskRequest to their classes.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from polar.config import Config
from polar.errors import RuntimeFailure, ValidationError
from polar.runtimes.base import ExecResult, Runtime
from polar.runtimes.local import LocalRuntime
from polar.task_request import RuntimeSpec

RUNTIMES: dict[str, type[Runtime]] = {"local": LocalRuntime}

__all__ = [
    "RUNTIMES",
    "ExecResult",
    "LocalRuntime",
    "Runtime",
    "attach_runtime",
    "check_runtime",
    "create_runtime",
]


def check_runtime(spec: RuntimeSpec, field: str) -> None:
    if spec.backend not in RUNTIMES:
        raise ValidationError(
            f"{field}.backend: {spec.backend!r} is not available here (available: {', '.join(sorted(RUNTIMES))})",
            field=f"{field}.backend",
        )


def create_runtime(session_id: uuid.UUID, spec: RuntimeSpec, config: Config) -> Runtime:
    return RUNTIMES[spec.backend].create(session_id, spec, config)


def attach_runtime(handle: Mapping[str, Any], config: Config) -> Runtime:
    backend = handle.get("backend")
    if backend not in RUNTIMES:
        raise RuntimeFailure(f"unknown runtime backend {backend!r} in handle")
    return RUNTIMES[str(backend)].attach(handle, config)
