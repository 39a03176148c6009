"""The ``python`` harness: ``module:function`` called with the instruction, in a fresh interpreter.

The function runs with the proxy environment (``OPENAI_BASE_URL`` etc.); it returns an exit code or None (0).
Its module must be one of Polar's own agents (``polar.agents``) or under the operator's ``POLAR_PLUGIN_MODULES``:
checked at submission and again by the entry point before it imports anything (``polar.codec.import_path``).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import ClassVar

from polar.codec.import_path import check_import_path
from polar.harnesses.base import HarnessContext, HarnessLaunch, proxy_environment

BUILT_IN_AGENTS = ("polar.agents",)


def allowed_targets(plugin_modules: Sequence[str]) -> tuple[str, ...]:
    """The module prefixes a ``python`` harness may import from: the built-in agents and the operator's."""
    return (*BUILT_IN_AGENTS, *plugin_modules)


def check_python_target(target: str, plugin_modules: Sequence[str]) -> None:
    """Refuse (``PluginNotAllowed``) a ``module:function`` outside the built-in agents and ``plugin_modules``."""
    check_import_path(target, allowed_targets(plugin_modules))


class PythonHarness:
    name: ClassVar[str] = "python"

    def launch(self, context: HarnessContext) -> HarnessLaunch:
        target = context.spec.command or ""
        allowed = ",".join(allowed_targets(context.plugin_modules))
        command = [sys.executable, "-m", "polar.harnesses.python_entry", allowed, target, context.instruction]
        return HarnessLaunch(command, proxy_environment(context))
