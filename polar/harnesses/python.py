"""The ``python`` harness: ``module:function`` called with the instruction, in a fresh interpreter.

The function runs with the proxy environment (``OPENAI_BASE_URL`` etc.); it returns an exit code or None (0).
"""

from __future__ import annotations

import sys
from typing import ClassVar

from polar.harnesses.base import HarnessContext, HarnessLaunch, proxy_environment


class PythonHarness:
    name: ClassVar[str] = "python"

    def launch(self, context: HarnessContext) -> HarnessLaunch:
        target = context.spec.command or ""
        command = [sys.executable, "-m", "polar.harnesses.python_entry", target, context.instruction]
        return HarnessLaunch(command, proxy_environment(context))
