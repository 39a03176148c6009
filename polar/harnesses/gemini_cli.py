"""The ``gemini_cli`` preset: Google's Gemini CLI, on the Gemini ``streamGenerateContent`` protocol.

    gemini --approval-mode=yolo --model=M [extra_args…] --prompt=INSTRUCTION

Pointed at the proxy by ``GOOGLE_GEMINI_BASE_URL`` and ``GEMINI_API_KEY``; ``<home>/.gemini/settings.json``
selects API-key auth (without it non-interactive runs fail with "Invalid auth method selected"), and
``GEMINI_CLI_TRUST_WORKSPACE=true`` trusts the session's work folder. Settings: ``max_turns``
(``model.maxSessionTurns``), ``extra_args``, ``mcp_servers`` (the ``mcpServers`` format), ``config`` (merged into
settings.json).
"""

from __future__ import annotations

from typing import Any, ClassVar

from polar.harnesses.base import HarnessContext, HarnessLaunch, proxy_environment
from polar.harnesses.preset import PresetSettings, binary, home_dir, merged, model_name, preset_settings, write_json


def gemini_settings(settings: PresetSettings, auth_type: str) -> dict[str, Any]:
    """settings.json for Gemini CLI and its fork Qwen Code: auth, no telemetry or update checks, the limits."""
    data: dict[str, Any] = {
        "security": {"auth": {"selectedType": auth_type}},
        "privacy": {"usageStatisticsEnabled": False},
        "general": {"disableAutoUpdate": True, "disableUpdateNag": True},
    }
    if settings.max_turns:
        data["model"] = {"maxSessionTurns": settings.max_turns}
    if settings.mcp_servers:
        data["mcpServers"] = settings.mcp_servers
    return merged(data, settings.config)


class GeminiCliHarness:
    name: ClassVar[str] = "gemini_cli"

    def launch(self, context: HarnessContext) -> HarnessLaunch:
        settings = preset_settings(context, accepts_config=True)
        program, model = binary(context), model_name(context)
        write_json(context, home_dir(context, ".gemini") / "settings.json", gemini_settings(settings, "gemini-api-key"))
        command = [program, "--approval-mode=yolo", f"--model={model}", *settings.extra_args]
        command.append(f"--prompt={context.instruction}")
        env = proxy_environment(context)
        env.update({"GEMINI_CLI_TRUST_WORKSPACE": "true", "GEMINI_MODEL": model})
        env.update(context.spec.env)
        return HarnessLaunch(command, env)
