"""Inside the ``python`` harness's process:
``python -m polar.harnesses.python_entry <allowed prefixes> module:function instruction``.

Kept apart from ``polar.harnesses`` so that starting it imports nothing but the target, and only a target under
the allowed module prefixes (comma-separated; ``polar.harnesses.python`` passes the built-in agents and
``POLAR_PLUGIN_MODULES``): anything else exits 2 with the reason, unimported.
"""

from __future__ import annotations

import sys

from polar.codec.import_path import import_object
from polar.errors import PluginNotAllowed


def main(argv: list[str]) -> int:
    """Import ``module:function``, call it with the instruction, return its exit code (None means 0)."""
    allowed, target, instruction = argv
    sys.path.insert(0, ".")
    try:
        function = import_object(target, tuple(p for p in allowed.split(",") if p))
    except PluginNotAllowed as exc:
        print(f"polar: python harness refused: {exc}", file=sys.stderr)
        return 2
    result = function(instruction)
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
