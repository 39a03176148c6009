"""What a sandbox shows of the host's tools: Polar's own Python, the harness cache, and the interpreter each venv in
the cache was made from (a CLI pinned to Python 3.12 or 3.13 runs on pyenv's, which is not Polar's)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from polar.runtimes._host_python import host_tool_paths, python_paths


def test_the_cache_and_each_venvs_own_interpreter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    other = tmp_path / "pyenv" / "versions" / "3.13.0"
    (other / "bin").mkdir(parents=True)
    venv = cache / "venvs" / "kimi_cli"
    venv.mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text(f"home = {other / 'bin'}\nversion = 3.13.0\n")
    (cache / "venvs" / "broken").mkdir()
    (cache / "venvs" / "broken" / "pyvenv.cfg").write_bytes(b"\xff\xfe")  # unreadable: skipped, not fatal
    monkeypatch.setenv("POLAR_HARNESS_CACHE", str(cache))
    paths = host_tool_paths()
    assert str(cache) in paths and str(other) in paths
    assert set(python_paths()) <= set(paths) and sys.base_prefix in paths


def test_without_a_cache_only_python(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POLAR_HARNESS_CACHE", str(tmp_path / "none"))
    assert host_tool_paths() == python_paths()
