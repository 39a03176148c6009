"""The ``droid`` preset: Factory's Droid CLI (``droid exec``), on OpenAI Chat Completions, with no Factory account.

    droid exec --skip-permissions-unsafe --output-format json -m custom:polar-0 [extra_args…] -- INSTRUCTION

``<home>/.factory/settings.json`` declares one "bring your own key" model: ``generic-chat-completion-api`` at
``baseUrl`` = the proxy's ``/v1`` with the session key; droid names it ``custom:<displayName>-<index>``. Without
``--skip-permissions-unsafe`` ``droid exec`` is read-only. Droid's installed wrapper runs its platform binary
(``@factory/cli-linux-x64``, installed beside it). Settings: ``extra_args``; ``max_turns`` and ``mcp_servers`` are
refused.
"""

from __future__ import annotations

from typing import ClassVar

from polar.harnesses.base import HarnessContext, HarnessLaunch, proxy_environment
from polar.harnesses.preset import binary, home_dir, model_name, preset_settings, refuse, write_json

DISPLAY_NAME = "polar"
MODEL_ID = f"custom:{DISPLAY_NAME}-0"  # how droid names the first custom model


class DroidHarness:
    name: ClassVar[str] = "droid"

    def launch(self, context: HarnessContext) -> HarnessLaunch:
        settings = preset_settings(context)
        refuse(context, settings, "max_turns", "mcp_servers")
        program, model = binary(context), model_name(context)
        custom = {"model": model, "displayName": DISPLAY_NAME, "baseUrl": f"{context.proxy_base}/v1",
                  "apiKey": context.proxy_key, "provider": "generic-chat-completion-api",
                  "maxOutputTokens": 8192}  # fmt: skip
        write_json(context, home_dir(context, ".factory") / "settings.json", {"customModels": [custom]})
        command = [program, "exec", "--skip-permissions-unsafe", "--output-format", "json", "-m", MODEL_ID]
        command += [*settings.extra_args, "--", context.instruction]
        env = proxy_environment(context)
        env.update(context.spec.env)
        return HarnessLaunch(command, env)
