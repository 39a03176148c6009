"""The host directories a sandboxed ``python`` needs, for runtimes that show the host's interpreter read-only."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import polar


def python_paths() -> list[str]:
    """The venv, its base interpreter's prefix and the ``polar`` package directory (editable installs live apart)."""
    paths = {sys.prefix, sys.base_prefix, str(Path(sys.executable).resolve().parent.parent)}
    paths.add(str(Path(polar.__file__).resolve().parent))
    return sorted(p for p in paths if os.path.isdir(p) and p not in ("/", "/usr", "/usr/local"))
