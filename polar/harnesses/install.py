"""The harness install cache: the coding-agent CLIs, installed from npm into one folder, never globally.

``install(["codex", "pi"])`` runs ``npm install --no-audit --no-fund --prefix <cache> <package>`` for each preset
not installed yet; presets find their binary under ``<cache>/node_modules/.bin/``. The cache is
``POLAR_HARNESS_CACHE``, else ``~/.cache/polar/harnesses``.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from polar.errors import RuntimeFailure, ValidationError


@dataclass(frozen=True)
class CliPackage:
    """A preset's npm package and the binary it puts in ``node_modules/.bin``."""

    package: str
    binary: str


PACKAGES: Mapping[str, CliPackage] = {
    "claude_code": CliPackage("@anthropic-ai/claude-code", "claude"),
    "codex": CliPackage("@openai/codex", "codex"),
    "gemini_cli": CliPackage("@google/gemini-cli", "gemini"),
    "qwen_code": CliPackage("@qwen-code/qwen-code", "qwen"),
    "opencode": CliPackage("opencode-ai", "opencode"),
    "pi": CliPackage("@mariozechner/pi-coding-agent", "pi"),
}
INSTALL_TIMEOUT_S = 900.0


def cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where the CLIs are installed: ``POLAR_HARNESS_CACHE`` or ``~/.cache/polar/harnesses``."""
    env = os.environ if env is None else env
    configured = env.get("POLAR_HARNESS_CACHE")
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "polar" / "harnesses"


def binary_path(name: str, cache: Path | None = None) -> Path:
    """The CLI binary of preset ``name`` in the cache (it may not exist)."""
    return (cache or cache_dir()) / "node_modules" / ".bin" / _package(name).binary


def require_binary(name: str, cache: Path | None = None) -> Path:
    """The installed CLI binary of preset ``name``; RuntimeFailure saying how to install it when missing."""
    path = binary_path(name, cache)
    if not path.exists():
        raise RuntimeFailure(
            f"harness {name!r}: the {_package(name).package} CLI is not installed in {path.parent.parent.parent} "
            f"(run `polar harness install {name}`, or set POLAR_HARNESS_CACHE to the cache that has it)"
        )
    return path


def installed_version(name: str, cache: Path | None = None) -> str | None:
    """The installed version of preset ``name``'s package, or None when it is not installed."""
    package = _package(name).package
    manifest = (cache or cache_dir()) / "node_modules" / package / "package.json"
    if not binary_path(name, cache).exists() or not manifest.exists():
        return None
    try:
        return str(json.loads(manifest.read_text())["version"])
    except (OSError, ValueError, KeyError) as exc:
        raise RuntimeFailure(f"cannot read {manifest}: {exc}") from exc


def install(names: Iterable[str], cache: Path | None = None) -> dict[str, str]:
    """Install the presets' CLIs that are missing (one npm call for all); their versions by preset name."""
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
    if missing:
        command = ["npm", "install", "--no-audit", "--no-fund", "--prefix", str(cache)]
        command += [PACKAGES[name].package for name in missing]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise RuntimeFailure(f"npm install failed: {exc}") from exc
        if done.returncode != 0:
            raise RuntimeFailure(f"npm install exited {done.returncode}: {done.stderr.strip()[-2000:]}")
    versions = {name: installed_version(name, cache) for name in names}
    broken = [name for name, version in versions.items() if version is None]
    if broken:
        raise RuntimeFailure(f"npm install finished but {', '.join(broken)} is still missing from {cache}")
    return {name: str(version) for name, version in versions.items()}


def installed(cache: Path | None = None) -> dict[str, str | None]:
    """Every preset with its installed version (None when not installed)."""
    return {name: installed_version(name, cache) for name in PACKAGES}


def _package(name: str) -> CliPackage:
    try:
        return PACKAGES[name]
    except KeyError:
        known = ", ".join(sorted(PACKAGES))
        raise ValidationError(f"unknown harness preset {name!r} (installable: {known})", field="name") from None
