"""What the six coding-agent CLI presets share: their settings, model name, private home and binary lookup.

Every preset runs its CLI from the install cache (``polar.harnesses.install``) with ``HOME`` set to
``<session_dir>/home``, where it writes the CLI's config; the real home is never read or written.
``spec.settings`` understood by the presets (each preset's docstring says which it honours):

- ``max_turns`` (int): the CLI's own turn limit;
- ``extra_args`` (list of str): appended to the command line before the instruction;
- ``mcp_servers`` (object): MCP servers in the CLI's own config format, keyed by server name;
- ``config`` (object): merged into the config file the preset writes (Gemini CLI's and Qwen Code's
  ``settings.json``, ``opencode.json``, Codex's ``config.toml`` top-level keys), objects key by key: e.g. a
  context window and compaction threshold. Refused by presets that write no such file.

Other keys are refused, so a typo does not pass silently.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from polar.errors import RuntimeFailure
from polar.harnesses.base import HarnessContext
from polar.harnesses.install import config_packages_dir, require_binary
from polar.runtimes.session_files import make_dirs, write_file

DEFAULT_MODEL = "polar-policy"
SETTINGS = ("max_turns", "extra_args", "mcp_servers", "config")


@dataclass(frozen=True)
class PresetSettings:
    """``spec.settings`` checked: the turn limit, extra command-line arguments and MCP servers."""

    max_turns: int | None = None
    extra_args: tuple[str, ...] = ()
    mcp_servers: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)


def preset_settings(context: HarnessContext, accepts_config: bool = False) -> PresetSettings:
    """The preset settings of ``context.spec``; RuntimeFailure naming a bad or unknown key, or ``config`` for a
    preset that writes no config file to merge it into."""
    raw = context.spec.settings
    name = context.spec.name
    unknown = sorted(set(raw) - set(SETTINGS))
    if unknown:
        raise RuntimeFailure(f"harness {name!r}: unknown settings {unknown} (known: {', '.join(SETTINGS)})")
    max_turns = raw.get("max_turns")
    if max_turns is not None and (not isinstance(max_turns, int) or isinstance(max_turns, bool) or max_turns < 1):
        raise RuntimeFailure(f"harness {name!r}: settings.max_turns must be a positive integer")
    extra = raw.get("extra_args") or []
    if not isinstance(extra, list) or not all(isinstance(arg, str) for arg in extra):
        raise RuntimeFailure(f"harness {name!r}: settings.extra_args must be a list of strings")
    servers = raw.get("mcp_servers") or {}
    if not isinstance(servers, dict):
        raise RuntimeFailure(f"harness {name!r}: settings.mcp_servers must be an object keyed by server name")
    config = raw.get("config") or {}
    if not isinstance(config, dict):
        raise RuntimeFailure(f"harness {name!r}: settings.config must be an object")
    if config and not accepts_config:
        raise RuntimeFailure(f"harness {name!r} writes no config file to merge settings.config into")
    return PresetSettings(max_turns, tuple(extra), dict(servers), dict(config))


def merged(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``extra`` merged in: objects key by key, anything else replaced."""
    out = dict(base)
    for key, value in extra.items():
        out[key] = merged(out[key], value) if isinstance(out.get(key), dict) and isinstance(value, dict) else value
    return out


def refuse(context: HarnessContext, settings: PresetSettings, *unsupported: str) -> None:
    """RuntimeFailure when a setting this CLI cannot honour was given."""
    given = [key for key in unsupported if context.spec.settings.get(key)]
    if given:
        raise RuntimeFailure(f"harness {context.spec.name!r} does not support settings {given}")


def model_name(context: HarnessContext) -> str:
    """The model the CLI asks for: ``spec.model``, else ``polar-policy``."""
    return context.spec.model or DEFAULT_MODEL


def home_dir(context: HarnessContext, *below: str) -> Path:
    """The session's private home, or the directory ``below`` it (created; never through a link a prepare step
    left there: UnsafePath)."""
    return make_dirs(context.session_dir, PurePosixPath("home", *below))


def binary(context: HarnessContext) -> str:
    """The CLI binary from the install cache; RuntimeFailure when it is not installed."""
    return str(require_binary(context.spec.name))


def link_config_packages(context: HarnessContext, config_dir: Path) -> None:
    """Give the CLI's config directory the packages it would install there at start (``CliPackage.config_packages``):
    npm's ``package.json`` and ``package-lock.json`` copied, its ``node_modules`` a link into the install cache,
    which sandboxes show read-only. With both files as npm left them, the CLI finds nothing to install."""
    source = config_packages_dir(context.spec.name)
    for name in ("package.json", "package-lock.json"):
        write_config(context, config_dir / name, (source / name).read_text())
    try:
        (config_dir / "node_modules").symlink_to(source / "node_modules", target_is_directory=True)
    except OSError as exc:  # a prepare step left something there
        raise RuntimeFailure(f"cannot link {config_dir / 'node_modules'} to the install cache: {exc}") from exc


def write_config(context: HarnessContext, path: Path, text: str) -> Path:
    """Write a config file at ``path`` in the session directory (parents created, owner-only since it may hold
    the key). The host writes it, often as root, after the task's prepare steps ran in the session: a link on the
    way is refused (UnsafePath, naming it), never written through."""
    try:
        return write_file(context.session_dir, path, text, mode=0o600)
    except OSError as exc:
        raise RuntimeFailure(f"cannot write harness config {path}: {exc}") from exc


def write_json(context: HarnessContext, path: Path, data: Any) -> Path:
    """Write ``data`` as indented JSON (see ``write_config``)."""
    return write_config(context, path, json.dumps(data, indent=2) + "\n")
