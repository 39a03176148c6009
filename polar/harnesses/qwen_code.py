"""The ``qwen_code`` preset: Qwen Code (a Gemini CLI fork), on OpenAI Chat Completions.

    qwen --yolo [extra_args…] --prompt=INSTRUCTION

Pointed at the proxy by ``OPENAI_BASE_URL``, ``OPENAI_API_KEY`` and ``OPENAI_MODEL`` (it has no ``--model``
flag); ``<home>/.qwen/settings.json`` selects OpenAI auth. Settings: ``max_turns`` (``model.maxSessionTurns``),
``extra_args``, ``mcp_servers`` (the ``mcpServers`` format), ``config`` (merged into settings.json).
"""

from __future__ import annotations

from typing import ClassVar

from polar.harnesses.base import HarnessContext, HarnessLaunch, proxy_environment
from polar.harnesses.gemini_cli import gemini_settings
from polar.harnesses.preset import binary, home_dir, model_name, preset_settings, write_json


class QwenCodeHarness:
    name: ClassVar[str] = "qwen_code"

    def launch(self, context: HarnessContext) -> HarnessLaunch:
        settings = preset_settings(context, accepts_config=True)
        program, model = binary(context), model_name(context)
        write_json(context, home_dir(context, ".qwen") / "settings.json", gemini_settings(settings, "openai"))
        command = [program, "--yolo", *settings.extra_args, f"--prompt={context.instruction}"]
        env = proxy_environment(context)
        env["OPENAI_MODEL"] = model
        env.update(context.spec.env)
        return HarnessLaunch(command, env)
