"""Inside the ``python`` harness's process: ``python -m polar.harnesses.python_entry module:function instruction``.

Kept apart from ``polar.harnesses`` so that starting it imports nothing but the target.
"""

from __future__ import annotations

import importlib
import sys


def main(argv: list[str]) -> int:
    """Import ``module:function``, call it with the instruction, return its exit code (None means 0)."""
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
