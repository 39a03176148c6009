"""The ``openclaw`` preset: OpenClaw's headless one-shot agent (``openclaw agent exec``), on OpenAI Chat
Completions (streaming).

    openclaw agent exec --json --config <home>/.openclaw/openclaw.json --model polar/M --timeout 0
                        [extra_args…] -- INSTRUCTION

``agent exec`` runs one embedded turn without a Gateway, in the working directory, with its run state in a
temporary directory under ``TMPDIR`` that it removes; unlike ``agent --local`` it writes no bootstrap files
(AGENTS.md, SOUL.md, …) and no ``.git`` into the workspace, so no ``openclaw setup`` is needed: the config file
alone suffices. ``openclaw.json`` declares the proxy as the only provider ``polar`` (``api:
"openai-completions"``, ``baseUrl=<proxy>/s/<key>/v1``) and turns off what would reach elsewhere: update checks,
memory-search embeddings (OpenAI's by default) and managed web search (its provider is picked from whatever API
keys the environment holds). ``--timeout 0`` leaves the deadline to Polar. stdout is one JSON envelope
(``ok``, ``status``, ``final``, ``usage``, ``toolSummary``…); exit 0 on success, 1 on a model or run error, 2 on
its own timeout. OpenClaw needs Node >= 24.16: the cache's Node goes first on ``PATH``. Settings: ``extra_args``,
``mcp_servers`` (OpenClaw's ``mcp.servers`` format: ``{"name": {"command": "...", "args": [...]}}``);
``max_turns`` is refused (OpenClaw has no turn limit).
"""

from __future__ import annotations

import os
from typing import Any, ClassVar

from polar.harnesses.base import HarnessContext, HarnessLaunch, proxy_environment
from polar.harnesses.install import runtime_bin_dirs
from polar.harnesses.preset import binary, home_dir, model_name, preset_settings, refuse, write_json

PROVIDER = "polar"


def openclaw_config(context: HarnessContext, model: str, mcp_servers: dict[str, Any]) -> dict[str, Any]:
    """openclaw.json: the proxy as the only provider, nothing that reaches another host."""
    entry = {"id": model, "name": model, "input": ["text"], "contextWindow": 262144, "maxTokens": 8192}
    provider = {"baseUrl": f"{context.proxy_base}/v1", "apiKey": context.proxy_key, "api": "openai-completions",
                "models": [entry]}  # fmt: skip
    config: dict[str, Any] = {
        # "replace": only this provider's catalogue, no bundled provider plugins' catalogue shards merged in.
        "models": {"mode": "replace", "providers": {PROVIDER: provider}},
        "agents": {"defaults": {"model": {"primary": f"{PROVIDER}/{model}"}}},
        "update": {"checkOnStart": False},
        # Memory search embeds with OpenAI (api.openai.com, the proxy key as credential) unless told otherwise.
        "memory": {"search": {"enabled": False}},
        "tools": {
            # web_search picks its provider from the API keys in the environment (the proxy key under
            # GEMINI_API_KEY and friends), which would send that key to the provider's own host.
            "web": {"search": {"enabled": False}},
            # agent exec confines file tools to the working directory by default, and writes files 0600 there;
            # like the other presets, let them reach the whole machine with ordinary modes.
            "fs": {"workspaceOnly": False},
        },
    }
    if mcp_servers:
        config["mcp"] = {"servers": mcp_servers}
    return config


class OpenclawHarness:
    name: ClassVar[str] = "openclaw"

    def launch(self, context: HarnessContext) -> HarnessLaunch:
        settings = preset_settings(context)
        refuse(context, settings, "max_turns")
        program, model = binary(context), model_name(context)
        config_path = home_dir(context, ".openclaw") / "openclaw.json"
        write_json(context, config_path, openclaw_config(context, model, settings.mcp_servers))
        # --config pins the file (a missing or invalid one fails the run instead of falling back to defaults);
        # "--" keeps an instruction starting with "-" from being read as an option.
        command = [program, "agent", "exec", "--json", "--config", str(config_path)]
        command += ["--model", f"{PROVIDER}/{model}", "--timeout", "0", *settings.extra_args, "--", context.instruction]
        env = proxy_environment(context)
        # openclaw.mjs runs under `#!/usr/bin/env node` and refuses Node < 24.16: the cache's Node comes first.
        path = env.get("PATH") or os.defpath
        env["PATH"] = os.pathsep.join([*(str(directory) for directory in runtime_bin_dirs(self.name)), path])
        env.update(
            {
                # Without it the CLI re-executes itself as a detached child in a process group of its own.
                "OPENCLAW_NO_RESPAWN": "1",
                # No downloads of its pinned fd/ripgrep helpers.
                "OPENCLAW_OFFLINE": "1",
                # Update checks and the telemetry ping that rides on them, whatever the config says.
                "OPENCLAW_NO_AUTO_UPDATE": "1",
            }
        )
        env.update(context.spec.env)
        return HarnessLaunch(command, env)
