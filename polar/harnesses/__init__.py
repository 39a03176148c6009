"""Harnesses: the agent programs sessions run. ``base`` holds the launch contract and the proxy environment;
one module per harness (``command``, ``python``, and the coding-agent CLI presets ``claude_code``, ``codex``,
``gemini_cli``, ``qwen_code``, ``opencode``, ``pi`` sharing ``preset``); ``install`` keeps the CLIs in a cache;
the registry maps TaskRequest ``harness.name`` values to them."""

from __future__ import annotations

from polar.errors import ValidationError
from polar.harnesses.base import Harness, HarnessContext, HarnessLaunch, proxy_environment
from polar.harnesses.claude_code import ClaudeCodeHarness
from polar.harnesses.codex import CodexHarness
from polar.harnesses.command import CommandHarness
from polar.harnesses.gemini_cli import GeminiCliHarness
from polar.harnesses.opencode import OpencodeHarness
from polar.harnesses.pi import PiHarness
from polar.harnesses.python import PythonHarness
from polar.harnesses.qwen_code import QwenCodeHarness
from polar.task_request import HarnessSpec

HARNESSES: dict[str, Harness] = {
    harness.name: harness
    for harness in (
        CommandHarness(),
        PythonHarness(),
        ClaudeCodeHarness(),
        CodexHarness(),
        GeminiCliHarness(),
        QwenCodeHarness(),
        OpencodeHarness(),
        PiHarness(),
    )
}

__all__ = ["HARNESSES", "Harness", "HarnessContext", "HarnessLaunch", "check_harness", "proxy_environment"]


def check_harness(spec: HarnessSpec, field: str) -> None:
    if spec.name not in HARNESSES:
        raise ValidationError(
            f"{field}.name: harness {spec.name!r} is not available yet (available: {', '.join(sorted(HARNESSES))})",
            field=f"{field}.name",
        )
