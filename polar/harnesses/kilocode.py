"""The ``kilocode`` preset: Kilo Code's CLI (``kilo run``, a fork of opencode), on OpenAI Chat Completions.

    kilo run --auto --format json -m polar/M [extra_args…] -- INSTRUCTION

``<home>/.config/kilo/kilo.json`` declares an OpenAI-compatible ``polar`` provider whose ``baseURL`` is the proxy,
allows every permission and turns off sharing, updates and Kilo's own cloud features; the XDG folders all sit in
the session home, and ``KILO_DISABLE_*`` variables keep it from fetching model lists, LSP servers or anything else.
Settings: ``extra_args``, ``mcp_servers`` (opencode's ``mcp`` format); ``max_turns`` is refused.
"""

from __future__ import annotations

from typing import Any, ClassVar

from polar.harnesses.base import HarnessContext, HarnessLaunch, proxy_environment
from polar.harnesses.opencode import PROVIDER, opencode_config
from polar.harnesses.preset import binary, home_dir, model_name, preset_settings, refuse, write_json

# What Kilo would otherwise reach beyond the proxy (its model catalogue, LSP downloads, its cloud and telemetry).
_OFF = ("AUTOUPDATE", "MODELS_FETCH", "LSP_DOWNLOAD", "SHARE", "SESSION_INGEST", "CODEBASE_INDEXING", "PRESENCE",
        "CLAUDE_CODE", "EXTERNAL_SKILLS", "DEFAULT_PLUGINS", "PROJECT_CONFIG", "EMBEDDED_WEB_UI")  # fmt: skip


def kilo_config(context: HarnessContext, model: str, mcp_servers: dict[str, Any]) -> dict[str, Any]:
    """kilo.json: opencode's config (Kilo is its fork) without opencode's schema URL, with the proxy's model also
    as the small model and the proxy as the only enabled provider."""
    config = {key: value for key, value in opencode_config(context, model, mcp_servers).items() if key != "$schema"}
    config.update({"small_model": f"{PROVIDER}/{model}", "enabled_providers": [PROVIDER]})
    return config


class KilocodeHarness:
    name: ClassVar[str] = "kilocode"

    def launch(self, context: HarnessContext) -> HarnessLaunch:
        settings = preset_settings(context)
        refuse(context, settings, "max_turns")
        program, model = binary(context), model_name(context)
        home = home_dir(context)
        config = kilo_config(context, model, settings.mcp_servers)
        write_json(context, home_dir(context, ".config", "kilo") / "kilo.json", config)
        command = [program, "run", "--auto", "--format", "json", "-m", f"{PROVIDER}/{model}", *settings.extra_args]
        command += ["--", context.instruction]
        env = proxy_environment(context)
        env.update({f"KILO_DISABLE_{name}": "1" for name in _OFF})
        env.update(
            {
                "XDG_CONFIG_HOME": str(home / ".config"),
                "XDG_DATA_HOME": str(home / ".local" / "share"),
                "XDG_CACHE_HOME": str(home / ".cache"),
                "XDG_STATE_HOME": str(home / ".local" / "state"),
                "OPENCODE_FAKE_VCS": "git",
            }
        )
        env.update(context.spec.env)
        return HarnessLaunch(command, env)
