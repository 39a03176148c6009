"""The ``codex`` preset: OpenAI's Codex CLI (``codex exec``), on the OpenAI Responses protocol.

    codex exec --dangerously-bypass-approvals-and-sandbox --skip-git-repo-check --json --model M
               [extra_args…] -- INSTRUCTION

``CODEX_HOME=<home>/.codex`` holds ``config.toml`` declaring a ``polar`` provider
(``base_url=<proxy>/s/<key>/v1``, ``wire_api="responses"``, key from ``POLAR_PROXY_KEY``) and ``auth.json``.
Settings: ``extra_args``, ``mcp_servers`` (Codex's ``[mcp_servers.<name>]`` tables: ``command``, ``args``,
``env``…), ``config`` (more top-level keys of config.toml); ``max_turns`` is refused (``codex exec`` has no turn
limit).
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

from polar.errors import RuntimeFailure
from polar.harnesses.base import HarnessContext, HarnessLaunch, proxy_environment
from polar.harnesses.preset import binary, home_dir, model_name, preset_settings, refuse, write_config, write_json


def toml_value(value: Any) -> str:
    """A TOML inline value for strings, numbers, booleans, lists and tables (JSON string escapes are TOML's)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float | str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))} = {toml_value(v)}" for k, v in value.items()) + "}"
    raise RuntimeFailure(f"harness 'codex': cannot write {value!r} to config.toml")


def config_toml(model: str, base_url: str, mcp_servers: dict[str, Any], extra: dict[str, Any] | None = None) -> str:
    """Codex's config.toml pointing the ``polar`` provider at the proxy; ``extra``: more top-level keys."""
    lines = [
        f"model = {toml_value(model)}",
        'model_provider = "polar"',
        *(f"{key} = {toml_value(value)}" for key, value in (extra or {}).items()),
        "",
        "[model_providers.polar]",
        'name = "polar"',
        f"base_url = {toml_value(base_url)}",
        'env_key = "POLAR_PROXY_KEY"',
        'wire_api = "responses"',
    ]
    for name, server in mcp_servers.items():
        if not isinstance(server, dict):
            raise RuntimeFailure(f"harness 'codex': mcp_servers.{name} must be an object")
        lines += ["", f"[mcp_servers.{json.dumps(str(name))}]"]
        lines += [f"{json.dumps(str(key))} = {toml_value(value)}" for key, value in server.items()]
    return "\n".join(lines) + "\n"


class CodexHarness:
    name: ClassVar[str] = "codex"

    def launch(self, context: HarnessContext) -> HarnessLaunch:
        settings = preset_settings(context, accepts_config=True)
        refuse(context, settings, "max_turns")
        program, model = binary(context), model_name(context)
        codex_home = home_dir(context, ".codex")
        toml = config_toml(model, f"{context.proxy_base}/v1", settings.mcp_servers, settings.config)
        write_config(context, codex_home / "config.toml", toml)
        write_json(context, codex_home / "auth.json", {"OPENAI_API_KEY": context.proxy_key})
        command = [program, "exec", "--dangerously-bypass-approvals-and-sandbox", "--skip-git-repo-check", "--json"]
        command += ["--model", model, *settings.extra_args, "--", context.instruction]
        env = proxy_environment(context)
        env.update({"CODEX_HOME": str(codex_home), "POLAR_PROXY_KEY": context.proxy_key})
        env.update(context.spec.env)
        return HarnessLaunch(command, env)
