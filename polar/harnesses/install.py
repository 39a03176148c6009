"""The harness install cache: the coding-agent CLIs, installed into one folder, never globally nor into Polar's
own environment.

``install(["codex", "hermes"])`` installs each preset not installed yet: the npm CLIs with one
``npm install --no-audit --no-fund --prefix <cache> <package>…`` (their binaries land in
``<cache>/node_modules/.bin/``), each Python CLI into a virtualenv of its own, ``<cache>/venvs/<preset>``
(mini-swe-agent pulls litellm, hermes its own openai and pydantic: they must not meet Polar's); a Python CLI that
needs a newer Python than Polar's gets its venv from that interpreter (``python3.12`` on ``PATH``, else pyenv's
``~/.pyenv/versions/3.12.*``), or a clear error naming the version. A CLI that needs a
newer Node.js than the system's gets one from npm's ``node-linux-<arch>`` package under ``<cache>/node/<version>``,
which its preset puts first on ``PATH`` (``runtime_bin_dirs``). What a CLI would install into its config directory
at every start (opencode's plugin SDK) is installed once into ``<cache>/config/<preset>`` for its preset to link
in. Every version is pinned and installed exactly; a different installed version counts as missing. The cache is
``POLAR_HARNESS_CACHE``, else ``~/.cache/polar/harnesses``.
"""

from __future__ import annotations

import fcntl
import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from polar.config import harness_cache_dir as cache_dir
from polar.errors import RuntimeFailure, ValidationError


@dataclass(frozen=True)
class CliPackage:
    """A preset's package, where it comes from, the binary it provides and what it needs to run."""

    package: str
    binary: str
    source: Literal["npm", "pypi"] = "npm"
    version: str | None = None  # pinned: installed as package@version (npm) or package==version (pypi)
    node: str | None = None  # the Node.js version it needs when the system's is older (npm ``node-linux-<arch>``)
    extras: str | None = None  # pip extras installed with it (``mcp`` for hermes' MCP servers)
    python: str | None = None  # the Python its venv needs when Polar's is older ("3.12"; ``python_for``)
    # npm packages installed with it, exactly these versions (a platform binary the registry here publishes under
    # another version than its wrapper's optional dependency names).
    companions: tuple[str, ...] = ()
    # npm packages the CLI installs into its config directory whenever they are missing there: installed once into
    # ``<cache>/config/<preset>`` (``config_packages_dir``) for the preset to link in, so that a session neither
    # fetches them from the registry itself nor spends the CPU on it.
    config_packages: tuple[str, ...] = ()

    def spec(self) -> str:
        """What the package manager is asked for."""
        name = f"{self.package}[{self.extras}]" if self.extras else self.package
        if self.version is None:
            return name
        return f"{name}{'==' if self.source == 'pypi' else '@'}{self.version}"


# Every CLI pinned: a test run (or a user's batch) gets the version that was proven, not whatever npm published
# last night, and the cache holds it until the pin moves.
PACKAGES: Mapping[str, CliPackage] = {
    "claude_code": CliPackage("@anthropic-ai/claude-code", "claude", version="2.1.332"),
    "codex": CliPackage("@openai/codex", "codex", version="0.169.0"),
    "gemini_cli": CliPackage("@google/gemini-cli", "gemini", version="0.61.0"),
    "qwen_code": CliPackage("@qwen-code/qwen-code", "qwen", version="0.24.4"),
    # opencode installs its plugin SDK into its config directory at every start (npm, 95 MB, ~17 CPU-seconds here).
    "opencode": CliPackage(
        "opencode-ai", "opencode", version="1.18.33", config_packages=("@opencode-ai/plugin@1.18.33",)
    ),
    "pi": CliPackage("@mariozechner/pi-coding-agent", "pi", version="0.73.1"),
    "mini_swe_agent": CliPackage("mini-swe-agent", "mini-swe-agent", "pypi", "2.4.6"),
    "hermes": CliPackage("hermes-agent", "hermes", "pypi", "0.19.0", extras="mcp"),
    # openclaw 2026.9.6 refuses Node < 24.16 in its preinstall step; these machines have Node 20.
    "openclaw": CliPackage("openclaw", "openclaw", version="2026.9.6", node="24.21.0"),
    # 7.8.1's platform binaries are not on the registry here; 7.7.7's are.
    "kilocode": CliPackage("@kilocode/cli", "kilo", version="7.7.7"),
    # cline 3's packages declare Node >= 22.
    "cline": CliPackage("cline", "cline", version="3.0.65", node="24.21.0"),
    # mistral-vibe 3.x pins certifi==2026.10.19, which the registry here has only as .post1.
    # droid's wrapper runs the platform binary its optional dependency names: 0.225.1, which the registry lacks.
    "droid": CliPackage("@factory/cli", "droid", version="0.225.1", companions=("@factory/cli-linux-x64@0.225.2",)),
    # kimi-cli 1.52.0 was archived: it only prints a notice. 1.51.0 is the last that runs.
    # On 3.12.1 (pyenv's here) typing lets a TypeError out of a generic's __call__ that kimi's slash commands
    # raise; 3.13 catches it.
    "kimi_cli": CliPackage("kimi-cli", "kimi", "pypi", "1.51.0", python="3.13"),
    "aider": CliPackage("aider-chat", "aider", "pypi", "0.86.2"),
    "mistral_vibe": CliPackage("mistral-vibe", "vibe", "pypi", "2.26.1", python="3.12"),
}
INSTALL_TIMEOUT_S = 900.0


def binary_path(name: str, cache: Path | None = None) -> Path:
    """The CLI binary of preset ``name`` in the cache (it may not exist)."""
    package, cache = _package(name), cache or cache_dir()
    if package.source == "pypi":
        return _venv(name, cache) / "bin" / package.binary
    return cache / "node_modules" / ".bin" / package.binary


def config_packages_dir(name: str, cache: Path | None = None) -> Path:
    """Where preset ``name``'s ``config_packages`` are installed (``package.json``, ``package-lock.json`` and
    ``node_modules`` as npm left them)."""
    return (cache or cache_dir()) / "config" / name


def runtime_bin_dirs(name: str, cache: Path | None = None) -> list[Path]:
    """Directories preset ``name`` needs first on ``PATH``: the bin directory of the Node.js it was installed
    for, when the system's is too old; none otherwise."""
    package = _package(name)
    return [] if package.node is None else [_node_binary(package.node, cache or cache_dir()).parent]


def require_binary(name: str, cache: Path | None = None) -> Path:
    """The installed CLI binary of preset ``name``; RuntimeFailure saying how to install it when missing."""
    cache = cache or cache_dir()
    path = binary_path(name, cache)
    if installed_version(name, cache) is None:
        raise RuntimeFailure(
            f"harness {name!r}: the {_package(name).spec()} CLI is not installed in {cache} "
            f"(run `polar harness install {name}`, or set POLAR_HARNESS_CACHE to the cache that has it)"
        )
    return path


def installed_version(name: str, cache: Path | None = None) -> str | None:
    """The installed version of preset ``name``'s package, or None when it (or the Node.js it needs) is not
    installed, or a version other than the pinned one is."""
    package, cache = _package(name), cache or cache_dir()
    if not binary_path(name, cache).exists():
        return None
    if package.node is not None and not _node_binary(package.node, cache).exists():
        return None
    if package.python is not None and _venv_python(name, cache) != package.python:
        return None  # made on another interpreter than the one pinned
    if package.config_packages and not (config_packages_dir(name, cache) / "package-lock.json").exists():
        return None
    version = _pypi_version(name, package, cache) if package.source == "pypi" else _npm_version(package, cache)
    return None if package.version is not None and version != package.version else version


def install(names: Iterable[str], cache: Path | None = None) -> dict[str, str]:
    """Install the presets' CLIs that are missing; their versions by preset name."""
    names = list(dict.fromkeys(names))
    for name in names:
        _package(name)
    cache = cache or cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    # Two installs into one cache at once (two test processes, two shells) corrupt each other's node_modules:
    # one at a time, and the second finds the first's work done.
    with (cache / ".install.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _install_locked(names, cache)


def _install_locked(names: list[str], cache: Path) -> dict[str, str]:
    missing = [name for name in names if installed_version(name, cache) is None]
    npm = [PACKAGES[name] for name in missing if PACKAGES[name].source == "npm"]
    nodes = sorted({package.node for package in npm if package.node is not None})
    for version in nodes:
        _run(["npm", "install", "--no-audit", "--no-fund", "--prefix", str(cache / "node" / version),
              f"node-linux-{_node_arch()}@{version}"], "npm install")  # fmt: skip
    if npm:
        # Install scripts run with the first ``node`` on PATH: the newer Node for CLIs that check it.
        path = os.pathsep.join([*(str(_node_binary(v, cache).parent) for v in nodes), os.environ.get("PATH", "")])
        command = ["npm", "install", "--no-audit", "--no-fund", "--prefix", str(cache)]
        specs = [spec for package in npm for spec in (package.spec(), *package.companions)]
        _run(command + specs, "npm install", {**os.environ, "PATH": path})
    for name in missing:
        if PACKAGES[name].config_packages:
            where = str(config_packages_dir(name, cache))
            command = ["npm", "install", "--no-audit", "--no-fund", "--save-exact", "--prefix", where]
            _run([*command, *PACKAGES[name].config_packages], "npm install")
    for name in missing:
        if PACKAGES[name].source == "pypi":
            _install_venv(name, cache)
    versions = {name: installed_version(name, cache) for name in names}
    broken = [name for name, version in versions.items() if version is None]
    if broken:
        raise RuntimeFailure(f"install finished but {', '.join(broken)} is still missing from {cache}")
    return {name: str(version) for name, version in versions.items()}


def _install_venv(name: str, cache: Path) -> None:
    """``python -m venv <cache>/venvs/<name>`` on the interpreter Polar runs on (its base, not Polar's venv:
    ``venv`` resolves it), then ``pip install package==version`` inside."""
    venv = _venv(name, cache)
    wanted = PACKAGES[name].python
    _run([python_for(wanted) if wanted else sys.executable, "-m", "venv", "--clear", str(venv)], "python -m venv")
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check", "--no-input", "-q"]
    _run([*pip, PACKAGES[name].spec()], "pip install")


def python_for(version: str, env: Mapping[str, str] | None = None) -> str:
    """An interpreter of Python ``version`` ("3.12"): ``python3.12`` on PATH, else the newest pyenv install of it;
    RuntimeFailure when this machine has none."""
    env = os.environ if env is None else env
    found = shutil.which(f"python{version}", path=env.get("PATH"))
    if found and _answers(found):
        return found
    root = Path(env.get("PYENV_ROOT") or Path.home() / ".pyenv")
    for candidate in sorted(root.glob(f"versions/{version}.*/bin/python{version}"), reverse=True):
        if _answers(str(candidate)):
            return str(candidate)
    raise RuntimeFailure(f"this CLI needs Python {version}, and neither python{version} on PATH nor {root}/versions "
                         f"has one")  # fmt: skip


def _answers(python: str) -> bool:
    """A pyenv shim answers ``python3.12`` even when no 3.12 is selected: run it to know."""
    try:
        return subprocess.run([python, "-c", ""], capture_output=True, timeout=30, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _run(command: list[str], what: str, env: Mapping[str, str] | None = None) -> None:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, check=False, env=env)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeFailure(f"{what} failed: {exc}") from exc
    if done.returncode != 0:
        raise RuntimeFailure(f"{what} exited {done.returncode}: {done.stderr.strip()[-2000:]}")


def _npm_version(package: CliPackage, cache: Path) -> str | None:
    manifest = cache / "node_modules" / package.package / "package.json"
    if not manifest.exists():
        return None
    try:
        return str(json.loads(manifest.read_text())["version"])
    except (OSError, ValueError, KeyError) as exc:
        raise RuntimeFailure(f"cannot read {manifest}: {exc}") from exc


def _pypi_version(name: str, package: CliPackage, cache: Path) -> str | None:
    site = [str(path) for path in (_venv(name, cache) / "lib").glob("python3*/site-packages")]
    found = [dist.version for dist in importlib.metadata.distributions(name=package.package, path=site)]
    return found[0] if found else None


def _venv_python(name: str, cache: Path) -> str | None:
    """The major.minor of the interpreter preset ``name``'s venv was made from (its pyvenv.cfg ``version``)."""
    try:
        lines = (_venv(name, cache) / "pyvenv.cfg").read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    for line in lines:
        key, _, value = line.partition("=")
        if key.strip() in ("version", "version_info"):
            return ".".join(value.strip().split(".")[:2])
    return None


def _venv(name: str, cache: Path) -> Path:
    return cache / "venvs" / name


def _node_arch() -> str:
    machine = platform.machine().lower()
    return {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}.get(machine, machine)


def _node_binary(version: str, cache: Path) -> Path:
    return cache / "node" / version / "node_modules" / f"node-linux-{_node_arch()}" / "bin" / "node"


def installed(cache: Path | None = None) -> dict[str, str | None]:
    """Every preset with its installed version (None when not installed)."""
    return {name: installed_version(name, cache) for name in PACKAGES}


def _package(name: str) -> CliPackage:
    try:
        return PACKAGES[name]
    except KeyError:
        known = ", ".join(sorted(PACKAGES))
        raise ValidationError(f"unknown harness preset {name!r} (installable: {known})", field="name") from None
