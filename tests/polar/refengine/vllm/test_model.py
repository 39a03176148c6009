"""``polar.refengine.vllm.model``: where the tiny model lives, and building it once, atomically. No model is built
here (that needs torch and transformers in vLLM's environment): stand-in interpreters play the builder."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from polar.errors import RuntimeFailure
from polar.refengine.vllm.model import ensure_tiny_model, tiny_model_dir


def _fake_python(tmp_path: Path, script: str) -> Path:
    """An 'interpreter' run as ``python -m polar.refengine.vllm.model SCRATCH --seed N`` (SCRATCH is ``$3``)."""
    python = tmp_path / "fake-python"
    python.write_text(f"#!/bin/sh\n{script}\n")
    python.chmod(0o755)
    return python


def test_tiny_model_dir_is_stable_and_per_seed_and_cache(tmp_path: Path) -> None:
    directory = tiny_model_dir(tmp_path, 0)
    assert directory == tiny_model_dir(tmp_path) == tiny_model_dir(tmp_path, 0)
    assert directory.parent == tmp_path / "models" and re.fullmatch(r"polar-tiny-[0-9a-f]{12}", directory.name)
    assert tiny_model_dir(tmp_path, 1) != directory and tiny_model_dir(tmp_path, 1).parent == directory.parent
    assert tiny_model_dir(tmp_path / "other", 0).parent == tmp_path / "other" / "models"
    assert not tmp_path.joinpath("models").exists()  # naming a directory builds nothing


def test_tiny_model_dir_defaults_to_the_engine_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("POLAR_ENGINE_CACHE", str(tmp_path))
    assert tiny_model_dir() == tiny_model_dir(tmp_path, 0)


def test_a_built_model_is_not_built_again(tmp_path: Path) -> None:
    directory = tiny_model_dir(tmp_path / "cache", 3)
    directory.mkdir(parents=True)
    (directory / "config.json").write_text("{}")
    never_run = _fake_python(tmp_path, "exit 1")
    assert ensure_tiny_model(never_run, tmp_path / "cache", 3) == directory


def test_a_build_lands_whole_in_place(tmp_path: Path) -> None:
    python = _fake_python(tmp_path, 'mkdir -p "$3" && echo "$5" > "$3/config.json"')
    directory = ensure_tiny_model(python, tmp_path / "cache", 2)
    assert directory == tiny_model_dir(tmp_path / "cache", 2)
    assert (directory / "config.json").read_text() == "2\n"
    assert [p.name for p in directory.parent.iterdir() if not p.name.startswith(".")] == [directory.name]


def test_a_failed_build_raises_and_leaves_no_model(tmp_path: Path) -> None:
    python = _fake_python(tmp_path, 'mkdir -p "$3"; echo "no torch here" >&2; exit 1')
    with pytest.raises(RuntimeFailure, match="no torch here"):
        ensure_tiny_model(python, tmp_path / "cache", 0)
    assert not tiny_model_dir(tmp_path / "cache", 0).exists()
