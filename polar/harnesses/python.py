"""The ``python`` harness: ``module:function`` called with the instruction, in a fresh interpreter.

The function runs with the proxy environment (``OPENAI_BASE_URL`` etc.); it returns an exit code or None (0).
"""

from __future__ import annotations

import importlib
import sys
from typing import ClassVar

from polar.harnesses.base import HarnessContext, HarnessLaunch, proxy_environment


class PythonHarness:
    name: ClassVar[str] = "python"

    def launch(self, context: HarnessContext) -> HarnessLaunch:
        target = context.spec.command or ""
        command = [sys.executable, "-m", "polar.harnesses.python", target, context.instruction]
        return HarnessLaunch(command, proxy_environment(context))


def main(argv: list[str]) -> int:
    """Entry point inside the harness process: ``python -m polar.harnesses.python module:function instruction``."""
    target, instruction = argv
    module_name, _, function_name = target.partition(":")
    sys.path.insert(0, ".")
    function = importlib.import_module(module_name)
    for part in function_name.split("."):
        function = getattr(function, part)
    result = function(instruction)
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
