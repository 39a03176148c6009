"""The ``mini_swe_agent`` preset: mini-swe-agent, on OpenAI Chat Completions through litellm, in its text-based
mode: every reply holds one fenced shell block, which it runs (no tool calls).

    mini-swe-agent --yolo --exit-immediately --cost-limit 0 -c mini_textbased.yaml --model-class litellm_textbased
                   [-c agent.step_limit=N] --model openai/M --output <home>/trajectory.json [extra_args…]
                   --task INSTRUCTION

It runs from its own virtualenv in the harness cache (``polar harness install mini_swe_agent``). litellm's
``openai/`` provider reads ``OPENAI_API_BASE`` (the proxy's ``/v1``) and ``OPENAI_API_KEY``;
``MSWEA_CONFIGURED`` skips the first-run wizard, ``MSWEA_COST_TRACKING=ignore_errors`` accepts a model litellm
has no price for, ``LITELLM_LOCAL_MODEL_COST_MAP`` keeps litellm from fetching its price list, and the global
config (``.env``) lives in the session home. Settings: ``max_turns`` (its ``agent.step_limit``), ``extra_args``;
``mcp_servers`` is refused (mini-swe-agent has none).
"""

from __future__ import annotations

from typing import ClassVar

from polar.harnesses.base import HarnessContext, HarnessLaunch, proxy_environment
from polar.harnesses.preset import binary, home_dir, model_name, preset_settings, refuse


class MiniSweAgentHarness:
    name: ClassVar[str] = "mini_swe_agent"

    def launch(self, context: HarnessContext) -> HarnessLaunch:
        settings = preset_settings(context)
        refuse(context, settings, "mcp_servers")
        program, model = binary(context), model_name(context)
        home = home_dir(context)
        command = [program, "--yolo", "--exit-immediately", "--cost-limit", "0"]
        command += ["-c", "mini_textbased.yaml", "--model-class", "litellm_textbased"]
        if settings.max_turns is not None:
            command += ["-c", f"agent.step_limit={settings.max_turns}"]
        command += ["--model", f"openai/{model}", "--output", str(home / "trajectory.json"), *settings.extra_args]
        command += ["--task", context.instruction]
        env = proxy_environment(context)
        env.update(
            {
                "OPENAI_API_BASE": f"{context.proxy_base}/v1",
                "MSWEA_CONFIGURED": "true",
                "MSWEA_COST_TRACKING": "ignore_errors",
                "MSWEA_GLOBAL_CONFIG_DIR": str(home_dir(context, ".config", "mini-swe-agent")),
                "MSWEA_SILENT_STARTUP": "1",
                "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            }
        )
        env.update(context.spec.env)
        return HarnessLaunch(command, env)
