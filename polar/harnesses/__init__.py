"""Harnesses: the agent programs sessions run. ``base`` holds the launch contract and the proxy environment;
one module per harness (``command``, ``python``, and the coding-agent CLI presets ``claude_code``, ``codex``,
``gemini_cli``, ``qwen_code``, ``opencode``, ``pi``, ``mini_swe_agent``, ``hermes``, ``openclaw`` sharing
``preset``, and ``oracle``, a Harbor task's own solution); ``install`` keeps the CLIs in a cache;
``registry`` maps TaskRequest ``harness.name`` values to them.

This file imports nothing: ``python -m polar.harnesses.python_entry`` starts every ``python`` harness session,
and a registry imported here (every harness, the runtimes, the Docker SDK) cost each of them about half a
second of CPU."""
