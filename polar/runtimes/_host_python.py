"""The host directories a sandbox shows read-only so harnesses can run in it: the host's Python (for ``python``
harnesses) and the harness install cache (for the CLI presets, which run the node CLIs installed there)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import polar
from polar.config import harness_cache_dir


def python_paths() -> list[str]:
    """The venv, its base interpreter's prefix and the ``polar`` package directory (editable installs live apart)."""
    paths = {sys.prefix, sys.base_prefix, str(Path(sys.executable).resolve().parent.parent)}
    paths.add(str(Path(polar.__file__).resolve().parent))
    return sorted(p for p in paths if os.path.isdir(p) and p not in ("/", "/usr", "/usr/local"))


def host_tool_paths() -> list[str]:
    """``python_paths`` plus the harness install cache, when it exists, and the prefix of every other interpreter a
    venv there was made from (a CLI needing Python 3.12 runs on pyenv's, which is not Polar's)."""
    cache = harness_cache_dir()
    if not cache.is_dir():
        return python_paths()
    paths = set(python_paths()) | {str(cache)} | _venv_bases(cache / "venvs")
    return sorted(p for p in paths if os.path.isdir(p) and p not in ("/", "/usr", "/usr/local"))


def _venv_bases(venvs: Path) -> set[str]:
    """The installation prefix (``home`` of pyvenv.cfg, less its ``bin``) of each venv under ``venvs``."""
    found = set()
    for config in venvs.glob("*/pyvenv.cfg"):
        try:
            lines = config.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError):
            continue
        for line in lines:
            key, _, value = line.partition("=")
            if key.strip() == "home" and value.strip():
                found.add(str(Path(value.strip()).resolve().parent))
    return found
