"""The ``opencode`` preset: opencode (``opencode run``), on OpenAI Chat Completions.

    opencode -m polar/M run --format=json [extra_args…] -- INSTRUCTION

``<home>/.config/opencode/opencode.json`` declares an OpenAI-compatible ``polar`` provider whose ``baseURL`` is
the proxy, and allows every permission; the XDG folders all sit in the session home. opencode wants a git work
tree: ``OPENCODE_FAKE_VCS=git`` stands in for one. Its plugin SDK, which it would fetch from npm into its config
directory at every start, is linked in from the install cache (``link_config_packages``). Settings: ``extra_args``,
``mcp_servers`` (opencode's ``mcp`` format: ``{"name": {"type": "local", "command": [...]}}``), ``config``
(merged into opencode.json); ``max_turns`` is refused.
"""

from __future__ import annotations

from typing import Any, ClassVar

from polar.harnesses.base import HarnessContext, HarnessLaunch, proxy_environment
from polar.harnesses.preset import (
    binary,
    home_dir,
    link_config_packages,
    merged,
    model_name,
    preset_settings,
    refuse,
    write_json,
)

PROVIDER = "polar"


def opencode_config(context: HarnessContext, model: str, mcp_servers: dict[str, Any]) -> dict[str, Any]:
    """opencode.json: the proxy as the only provider, every permission allowed, no sharing or updates."""
    config: dict[str, Any] = {
        "$schema": "https://opencode.ai/config.json",
        "provider": {
            PROVIDER: {
                "npm": "@ai-sdk/openai-compatible",
                "name": "Polar",
                "options": {"baseURL": f"{context.proxy_base}/v1", "apiKey": context.proxy_key},
                "models": {model: {"name": model}},
            }
        },
        "model": f"{PROVIDER}/{model}",
        "permission": {"edit": "allow", "bash": "allow", "webfetch": "allow", "external_directory": "allow"},
        "autoupdate": False,
        "share": "disabled",
    }
    if mcp_servers:
        config["mcp"] = mcp_servers
    return config


class OpencodeHarness:
    name: ClassVar[str] = "opencode"

    def launch(self, context: HarnessContext) -> HarnessLaunch:
        settings = preset_settings(context, accepts_config=True)
        refuse(context, settings, "max_turns")
        program, model = binary(context), model_name(context)
        home = home_dir(context)
        config = merged(opencode_config(context, model, settings.mcp_servers), settings.config)
        config_dir = home_dir(context, ".config", "opencode")
        write_json(context, config_dir / "opencode.json", config)
        link_config_packages(context, config_dir)
        command = [program, "-m", f"{PROVIDER}/{model}", "run", "--format=json", *settings.extra_args]
        command += ["--", context.instruction]
        env = proxy_environment(context)
        env.update(
            {
                "OPENCODE_FAKE_VCS": "git",
                "XDG_CONFIG_HOME": str(home / ".config"),
                "XDG_DATA_HOME": str(home / ".local" / "share"),
                "XDG_CACHE_HOME": str(home / ".cache"),
                "XDG_STATE_HOME": str(home / ".local" / "state"),
                "OPENCODE_DISABLE_AUTOUPDATE": "1",
                "OPENCODE_DISABLE_MODELS_FETCH": "1",
            }
        )
        env.update(context.spec.env)
        return HarnessLaunch(command, env)
