"""Harnesses: the agent programs sessions run. ``base`` holds the launch contract and the proxy environment;
one module per harness; the registry maps TaskRequest ``harness.name`` values to them."""

from __future__ import annotations

from polar.errors import ValidationError
from polar.harnesses.base import Harness, HarnessContext, HarnessLaunch, proxy_environment
from polar.harnesses.command import CommandHarness
from polar.harnesses.python import PythonHarness
from polar.task_request import HarnessSpec

HARNESSES: dict[str, Harness] = {"command": CommandHarness(), "python": PythonHarness()}

__all__ = ["HARNESSES", "Harness", "HarnessContext", "HarnessLaunch", "check_harness", "proxy_environment"]


def check_harness(spec: HarnessSpec, field: str) -> None:
    if spec.name not in HARNESSES:
        raise ValidationError(
            f"{field}.name: harness {spec.name!r} is not available yet (available: {', '.join(sorted(HARNESSES))})",
            field=f"{field}.name",
        )
