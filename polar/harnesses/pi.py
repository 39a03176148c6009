"""The ``pi`` preset: Mario Zechner's pi coding agent, on OpenAI Chat Completions (streaming).

    pi --print --mode json --no-session --provider polar --model M [extra_args…] INSTRUCTION

``<home>/.pi/agent/models.json`` declares the ``polar`` provider (``baseUrl=<proxy>/s/<key>/v1``, an
``openai-completions`` model, compat flags for a plain Chat Completions server); ``PI_OFFLINE=1`` keeps it from
fetching anything else. Settings: ``extra_args``; ``max_turns`` and ``mcp_servers`` are refused (pi has neither).
"""

from __future__ import annotations

from typing import Any, ClassVar

from polar.harnesses.base import HarnessContext, HarnessLaunch, proxy_environment
from polar.harnesses.preset import binary, home_dir, model_name, preset_settings, refuse, write_json

PROVIDER = "polar"


def models_json(context: HarnessContext, model: str) -> dict[str, Any]:
    """pi's models.json with the proxy as provider ``polar``."""
    compat = {"supportsDeveloperRole": False, "supportsReasoningEffort": False, "supportsStore": False,
              "maxTokensField": "max_tokens"}  # fmt: skip
    entry = {"id": model, "name": model, "api": "openai-completions", "contextWindow": 262144, "maxTokens": 8192}
    provider = {"baseUrl": f"{context.proxy_base}/v1", "apiKey": context.proxy_key, "api": "openai-completions",
                "compat": compat, "models": [entry]}  # fmt: skip
    return {"providers": {PROVIDER: provider}}


class PiHarness:
    name: ClassVar[str] = "pi"

    def launch(self, context: HarnessContext) -> HarnessLaunch:
        settings = preset_settings(context)
        refuse(context, settings, "max_turns", "mcp_servers")
        program, model = binary(context), model_name(context)
        agent_dir = home_dir(context, ".pi", "agent")
        write_json(context, agent_dir / "models.json", models_json(context, model))
        command = [program, "--print", "--mode", "json", "--no-session", "--provider", PROVIDER, "--model", model]
        command += [*settings.extra_args, context.instruction]
        env = proxy_environment(context)
        env.update({"PI_OFFLINE": "1", "PI_CODING_AGENT_DIR": str(agent_dir)})
        env.update(context.spec.env)
        return HarnessLaunch(command, env)
