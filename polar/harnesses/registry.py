"""The harnesses by TaskRequest ``harness.name``, and the check a submitted harness spec must pass."""

from __future__ import annotations

from collections.abc import Sequence

from polar.contract.task_request import HarnessSpec
from polar.errors import PluginNotAllowed, ValidationError
from polar.harnesses.aider import AiderHarness
from polar.harnesses.base import Harness
from polar.harnesses.claude_code import ClaudeCodeHarness
from polar.harnesses.cline import ClineHarness
from polar.harnesses.codex import CodexHarness
from polar.harnesses.command import REFUSAL, CommandHarness, placeholder_problem
from polar.harnesses.droid import DroidHarness
from polar.harnesses.gemini_cli import GeminiCliHarness
from polar.harnesses.hermes import HermesHarness
from polar.harnesses.kilocode import KilocodeHarness
from polar.harnesses.kimi_cli import KimiCliHarness
from polar.harnesses.mini_swe_agent import MiniSweAgentHarness
from polar.harnesses.mistral_vibe import MistralVibeHarness
from polar.harnesses.openclaw import OpenclawHarness
from polar.harnesses.opencode import OpencodeHarness
from polar.harnesses.oracle import OracleHarness, solution_files
from polar.harnesses.pi import PiHarness
from polar.harnesses.python import PythonHarness, check_python_target
from polar.harnesses.qwen_code import QwenCodeHarness

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
        MiniSweAgentHarness(),
        HermesHarness(),
        OpenclawHarness(),
        OracleHarness(),
        KilocodeHarness(),
        ClineHarness(),
        MistralVibeHarness(),
        DroidHarness(),
        KimiCliHarness(),
        AiderHarness(),
    )
}

__all__ = ["HARNESSES", "check_harness"]


def check_harness(spec: HarnessSpec, field: str, plugin_modules: Sequence[str] = ()) -> None:
    """Refuse a harness that is not available, a ``command`` template that would let the instruction out of its
    quoting, or a ``python`` target outside the built-in agents and ``plugin_modules`` (POLAR_PLUGIN_MODULES)."""
    if spec.name not in HARNESSES:
        raise ValidationError(
            f"{field}.name: harness {spec.name!r} is not available yet (available: {', '.join(sorted(HARNESSES))})",
            field=f"{field}.name",
        )
    if spec.name == "command" and (problem := placeholder_problem(spec.command or "")) is not None:
        raise ValidationError(f"{field}.command: {REFUSAL} ({problem})", field=f"{field}.command")
    if spec.name == "oracle":
        try:
            solution_files(spec.settings)
        except ValueError as exc:
            raise ValidationError(f"{field}.settings.{exc}", field=f"{field}.settings") from exc
    if spec.name == "python":
        try:
            check_python_target(spec.command or "", plugin_modules)
        except PluginNotAllowed as exc:
            raise PluginNotAllowed(f"{field}.command: {exc}", field=f"{field}.command") from exc
