"""The ``hermes`` preset: Nous Research's hermes-agent (``hermes chat``), on OpenAI Chat Completions (streaming).

    hermes --yolo chat --quiet --provider polar --model M [--max-turns N] [extra_args…] --query=INSTRUCTION

``HERMES_HOME=<home>/.hermes`` holds ``config.yaml``, written as JSON (which YAML reads):

    {"model": {"provider": "polar", "default": M, "context_length": 262144, "max_tokens": 8192,
               "supports_vision": false, "ollama_num_ctx": 0},
     "providers": {"polar": {"base_url": "<proxy>/s/<key>/v1", "key_env": "OPENAI_API_KEY",
                             "api_mode": "chat_completions"}},
     "memory": {"memory_enabled": false, "user_profile_enabled": false}, "checkpoints": {"enabled": false},
     "compression": {"enabled": false}, "terminal": {"backend": "local"},
     "security": {"tirith_enabled": false, "allow_lazy_installs": false}, "lsp": {"install_strategy": "manual"},
     "skills": {"creation_nudge_interval": 0}, "clarify": {"timeout": 0}}

and ``.update_check``, hermes' own update-check cache, seeded as fresh so it does not ask PyPI (no setting turns
that check off). One task is one streaming conversation: two chat calls to create a file, plus hermes' own
"verify your edit" nudges (extra user turns) after code edits in a git work tree. To price calls hermes also
GETs ``<base>/models`` and, when the proxy's address is loopback or private, ``<base minus /v1>/api/v1/models``,
``/api/tags``, ``/v1/props``, ``/props`` and ``/version`` (at most every 5 minutes); nothing goes elsewhere.

Settings: ``max_turns`` (``--max-turns``: hermes' budget of tool-calling iterations; past it hermes makes one
more call, without tools, asking for a summary, and exits 0), ``extra_args``, ``mcp_servers`` (hermes'
``mcp_servers`` format: ``{"name": {"command": ..., "args": [...], "env": {...}}}`` or ``{"url": ...}``;
refused when the install lacks the ``mcp`` package of the ``hermes-agent[mcp]`` extra).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, ClassVar

from polar.errors import RuntimeFailure
from polar.harnesses.base import HarnessContext, HarnessLaunch, proxy_environment
from polar.harnesses.install import installed_version
from polar.harnesses.preset import binary, home_dir, model_name, preset_settings, write_json

PROVIDER = "polar"
# Hermes refuses a model under 64K tokens of context, and without a stated window it probes the server and then
# models.dev and openrouter.ai: a fixed claim (pi's) skips all that. It only sets compression thresholds, and
# compression is off, so an engine with less context answers with its own error instead.
CONTEXT_LENGTH = 262144
# Hermes' default for a custom endpoint is 64K output tokens, more than most served models hold with the prompt.
# HERMES_MAX_TOKENS in spec.env overrides it (hermes reads that variable before config.yaml).
MAX_TOKENS = 8192


def hermes_config(context: HarnessContext, model: str, mcp_servers: dict[str, Any]) -> dict[str, Any]:
    """config.yaml: the proxy as provider ``polar``, and every feature that would reach another host, write outside
    the session, start a side conversation or wait for a user turned off."""
    config: dict[str, Any] = {
        "model": {
            "provider": PROVIDER,
            "default": model,
            "context_length": CONTEXT_LENGTH,
            "max_tokens": MAX_TOKENS,
            # Unknown vision support makes hermes probe the proxy for an Ollama server; the served policy reads
            # text, so the image tools (vision_analyze, browser_vision) are not offered.
            "supports_vision": False,
            # 0 skips the Ollama num_ctx probe of a loopback/private base URL and sends no options.num_ctx.
            "ollama_num_ctx": 0,
        },
        # A named custom provider; api_mode (not the reference's ``transport: openai_chat``, which hermes' runtime
        # resolver does not accept) pins Chat Completions whatever the URL looks like.
        "providers": {
            PROVIDER: {
                "base_url": f"{context.proxy_base}/v1",
                "key_env": "OPENAI_API_KEY",
                "api_mode": "chat_completions",
            }
        },
        # On, hermes keeps MEMORY.md/USER.md in HERMES_HOME, injects them and forks "review" side conversations.
        "memory": {"memory_enabled": False, "user_profile_enabled": False},
        # Hermes' default too; stated so a changed default cannot start shadow-git snapshots of the work tree.
        "checkpoints": {"enabled": False},
        # Compression summarises through an auxiliary conversation and judges the window by CONTEXT_LENGTH, a claim.
        "compression": {"enabled": False},
        "terminal": {"backend": "local"},
        # tirith (a command scanner) is downloaded from GitHub when missing; lazy installs pip-install backends
        # (edge-tts on every start) into the shared install-cache venv.
        "security": {"tirith_enabled": False, "allow_lazy_installs": False},
        # "auto" npm-installs pyright & co. into HERMES_HOME when code is written in a git work tree; "manual"
        # still uses a language server the task's image has on PATH.
        "lsp": {"install_strategy": "manual"},
        # After 10+ tool iterations hermes forks a daemon "save a skill?" conversation that races the exit.
        "skills": {"creation_nudge_interval": 0},
        # The clarify tool waits 120 s for an answer nobody can type; 0 answers "decide yourself" at once.
        "clarify": {"timeout": 0},
    }
    if mcp_servers:
        config["mcp_servers"] = mcp_servers
    return config


def site_packages(program: str) -> Path | None:
    """The site-packages of the virtualenv whose ``bin/`` holds ``program``."""
    found = sorted(Path(program).resolve().parent.parent.glob("lib/python*/site-packages"))
    return found[0] if found else None


class HermesHarness:
    name: ClassVar[str] = "hermes"

    def launch(self, context: HarnessContext) -> HarnessLaunch:
        settings = preset_settings(context)
        program, model = binary(context), model_name(context)
        site = site_packages(program)
        if settings.mcp_servers and site is not None and not (site / "mcp").is_dir():
            # Without the mcp package hermes skips mcp_servers silently (a debug log line): refuse instead.
            raise RuntimeFailure(
                f"harness {context.spec.name!r}: settings.mcp_servers needs hermes' MCP support, the mcp package of "
                f"the hermes-agent[mcp] extra, which {site} lacks"
            )
        hermes_home = home_dir(context, ".hermes")
        write_json(context, hermes_home / "config.yaml", hermes_config(context, model, settings.mcp_servers))
        version = installed_version(self.name)
        if version is not None:
            # Every `hermes chat` asks pypi.org for a newer release unless this cache is under 6 h old and names the
            # running version; no setting or variable turns the check off.
            write_json(
                context, hermes_home / ".update_check", {"ts": time.time(), "behind": 0, "rev": None, "ver": version}
            )
        # --yolo: no approval prompt for "dangerous" commands (nobody answers one); --quiet: no banner or spinner,
        # the final answer on stdout and "session_id: …" on stderr. The instruction is one argv element after
        # --query=, so one starting with "-" is not read as an option.
        command = [program, "--yolo", "chat", "--quiet", "--provider", PROVIDER, "--model", model]
        if settings.max_turns is not None:
            command += ["--max-turns", str(settings.max_turns)]
        command += [*settings.extra_args, f"--query={context.instruction}"]
        env = proxy_environment(context)
        env.update(
            {
                "HERMES_HOME": str(hermes_home),
                # The terminal tool reads its backend from here when the CLI's config bridge has not run.
                "TERMINAL_ENV": "local",
                # Seals the install-cache venv even if config.yaml is unreadable (lazy installs then fail open).
                "HERMES_DISABLE_LAZY_INSTALLS": "1",
            }
        )
        env.update(context.spec.env)
        return HarnessLaunch(command, env)
