"""The host directories a sandbox shows read-only so harnesses can run in it: the host's Python (for ``python``
harnesses) and the harness install cache (for the CLI presets, which run the node CLIs installed there)."""

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


def host_tool_paths() -> list[str]:
    """``python_paths`` plus the harness install cache, when it exists."""
    from polar.harnesses.install import cache_dir

    cache = cache_dir()
    return python_paths() + ([str(cache)] if cache.is_dir() else [])
