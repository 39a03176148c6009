"""The ``claude_code`` preset: Anthropic's Claude Code CLI, headless, on the Anthropic Messages protocol.

    claude --verbose --output-format=stream-json --dangerously-skip-permissions --model M [--max-turns N]
           [--mcp-config <home>/.claude/mcp.json] [extra_args…] -p INSTRUCTION

Pointed at the proxy by ``ANTHROPIC_BASE_URL`` (no ``/v1``) and ``ANTHROPIC_API_KEY``; its config lives in
``CLAUDE_CONFIG_DIR=<home>/.claude``. Every model alias (sonnet, opus, haiku, subagents) is pinned to the served
model. ``IS_SANDBOX=1`` lets ``--dangerously-skip-permissions`` run as root. Settings: ``max_turns``,
``extra_args``, ``mcp_servers`` (Claude's ``mcpServers`` format: ``{"name": {"command": ..., "args": [...]}}``).
"""

from __future__ import annotations

from typing import ClassVar

from polar.harnesses.base import HarnessContext, HarnessLaunch, proxy_environment
from polar.harnesses.preset import binary, home_dir, model_name, preset_settings, write_json


class ClaudeCodeHarness:
    name: ClassVar[str] = "claude_code"

    def launch(self, context: HarnessContext) -> HarnessLaunch:
        settings = preset_settings(context)
        program, model = binary(context), model_name(context)
        config_dir = home_dir(context, ".claude")
        command = [program, "--verbose", "--output-format=stream-json", "--dangerously-skip-permissions"]
        command += ["--model", model]
        if settings.max_turns:
            command += ["--max-turns", str(settings.max_turns)]
        if settings.mcp_servers:
            mcp = write_json(context, config_dir / "mcp.json", {"mcpServers": settings.mcp_servers})
            command += ["--mcp-config", str(mcp)]
        command += [*settings.extra_args, "-p", context.instruction]
        env = proxy_environment(context)
        env.update(
            {
                "CLAUDE_CONFIG_DIR": str(config_dir),
                "IS_SANDBOX": "1",
                "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
                "DISABLE_AUTOUPDATER": "1",
                "DISABLE_TELEMETRY": "1",
                "ANTHROPIC_MODEL": model,
                "ANTHROPIC_DEFAULT_SONNET_MODEL": model,
                "ANTHROPIC_DEFAULT_OPUS_MODEL": model,
                "ANTHROPIC_DEFAULT_HAIKU_MODEL": model,
                "ANTHROPIC_SMALL_FAST_MODEL": model,
                "CLAUDE_CODE_SUBAGENT_MODEL": model,
            }
        )
        env.update(context.spec.env)
        return HarnessLaunch(command, env)
