"""The ``mistral_vibe`` preset: Mistral's Vibe CLI in programmatic mode (``vibe -p``: every tool auto-approved),
on OpenAI Chat Completions.

    vibe --trust --output json [--max-turns N] [extra_args…] --prompt=INSTRUCTION

``VIBE_HOME=<home>/.vibe`` holds ``config.toml``: one generic (OpenAI-compatible) provider ``polar`` with
``api_base`` = the proxy's ``/v1`` and the key in ``OPENAI_API_KEY``, the model ``M`` on it as the active model,
and telemetry, update checks, auto-updates and notifications off; no Mistral account is used. ``--trust`` trusts
the working directory for this run only (else it asks). It runs from its own Python 3.12 virtualenv in the harness
cache (3.x pins a certifi release the registry here lacks: 2.x is pinned). Settings: ``max_turns``
(``--max-turns``), ``extra_args``; ``mcp_servers`` is refused.
"""

from __future__ import annotations

import json
from typing import ClassVar

from polar.harnesses.base import HarnessContext, HarnessLaunch, proxy_environment
from polar.harnesses.preset import binary, home_dir, model_name, preset_settings, refuse, write_config

PROVIDER = "polar"


def vibe_config(context: HarnessContext, model: str) -> str:
    """config.toml (JSON strings are TOML basic strings): the proxy as the only provider, nothing sent elsewhere."""
    text = json.dumps
    return "\n".join(
        [
            f"active_model = {text(model)}",
            "enable_telemetry = false",
            "enable_update_checks = false",
            "enable_auto_update = false",
            "enable_notifications = false",
            "",
            "[[providers]]",
            f"name = {text(PROVIDER)}",
            f"api_base = {text(context.proxy_base + '/v1')}",
            'api_key_env_var = "OPENAI_API_KEY"',
            'backend = "generic"',
            "",
            "[[models]]",
            f"name = {text(model)}",
            f"provider = {text(PROVIDER)}",
            f"alias = {text(model)}",
            "",
        ]
    )


class MistralVibeHarness:
    name: ClassVar[str] = "mistral_vibe"

    def launch(self, context: HarnessContext) -> HarnessLaunch:
        settings = preset_settings(context)
        refuse(context, settings, "mcp_servers")
        program, model = binary(context), model_name(context)
        vibe_home = home_dir(context, ".vibe")
        write_config(context, vibe_home / "config.toml", vibe_config(context, model))
        command = [program, "--trust", "--output", "json"]
        if settings.max_turns is not None:
            command += ["--max-turns", str(settings.max_turns)]
        command += [*settings.extra_args, f"--prompt={context.instruction}"]
        env = proxy_environment(context)
        env["VIBE_HOME"] = str(vibe_home)
        env.update(context.spec.env)
        return HarnessLaunch(command, env)
