"""The ``kimi_cli`` preset: Moonshot's kimi-cli in print mode (non-interactive, every tool call approved), on
OpenAI Chat Completions.

    kimi --print --output-format stream-json --yolo --config-file <home>/.kimi/config.json -m polar
         [--max-steps-per-turn N] [extra_args…] --prompt=INSTRUCTION

``config.json`` declares one provider ``polar`` of type ``openai_legacy`` (plain Chat Completions) with
``base_url`` = the proxy's ``/v1`` and the session key, the model ``M`` on it as the default, and telemetry off;
no Kimi account is used. ``KIMI_SHARE_DIR`` keeps its sessions and logs in the session home, and
``KIMI_CLI_NO_AUTO_UPDATE``/``KIMI_DISABLE_TELEMETRY`` keep it from reaching anything else. It runs from its own
Python 3.13 virtualenv (on 3.12.1 its slash commands raise in typing); 1.51.0 is pinned, the last release before
the package was archived (1.52.0 only prints a notice pointing elsewhere). Settings: ``max_turns``
(``--max-steps-per-turn``), ``extra_args``, ``mcp_servers`` (kimi's ``mcpServers`` format, passed as
``--mcp-config``).
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

from polar.harnesses.base import HarnessContext, HarnessLaunch, proxy_environment
from polar.harnesses.preset import binary, home_dir, model_name, preset_settings, write_json

PROVIDER = "polar"
CONTEXT_SIZE = 262144


def kimi_config(context: HarnessContext, model: str) -> dict[str, Any]:
    """config.json: the proxy as the only provider, its one model the default, telemetry off."""
    return {
        "default_model": PROVIDER,
        "default_yolo": True,
        "providers": {
            PROVIDER: {"type": "openai_legacy", "base_url": f"{context.proxy_base}/v1", "api_key": context.proxy_key}
        },
        "models": {PROVIDER: {"provider": PROVIDER, "model": model, "max_context_size": CONTEXT_SIZE}},
        "telemetry": False,
    }


class KimiCliHarness:
    name: ClassVar[str] = "kimi_cli"

    def launch(self, context: HarnessContext) -> HarnessLaunch:
        settings = preset_settings(context)
        program, model = binary(context), model_name(context)
        kimi_home = home_dir(context, ".kimi")
        config = write_json(context, kimi_home / "config.json", kimi_config(context, model))
        command = [program, "--print", "--output-format", "stream-json", "--yolo", "--config-file", str(config)]
        command += ["-m", PROVIDER]
        if settings.max_turns is not None:
            command += ["--max-steps-per-turn", str(settings.max_turns)]
        if settings.mcp_servers:
            command += ["--mcp-config", json.dumps({"mcpServers": settings.mcp_servers})]
        command += [*settings.extra_args, f"--prompt={context.instruction}"]
        env = proxy_environment(context)
        env.update({"KIMI_SHARE_DIR": str(kimi_home), "KIMI_CLI_NO_AUTO_UPDATE": "1", "KIMI_DISABLE_TELEMETRY": "1"})
        # kimi reads these over its config when set; the proxy environment sets none of them, a task's env might.
        for name in ("KIMI_BASE_URL", "KIMI_API_KEY", "KIMI_MODEL_NAME"):
            env.pop(name, None)
        env.update(context.spec.env)
        return HarnessLaunch(command, env)
