"""What real vLLM is held to: a policy's answer for a prompt, as token ids, and the record of what was sampled.

Both are plain Python over the reference tokenizer and chat template (the same ones the tiny model's directory
holds), so they are tested without vLLM; ``forcing`` is the thin adapter that vLLM loads.

    answers = PolicyAnswers("tool_user", {})
    answers.target(prompt_ids, seed=None)   # the ids the model must sample, end of turn included; None: free
    SampleLog(path).record(prompt_ids, sampled_ids)
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from polar.chat.chat_template import ChatTemplate
from polar.chat.tokenizer import load_tokenizer
from polar.refengine.generation import Generator
from polar.refengine.policies import ModelSamples, SamplingParams, load_policy
from polar.refengine.protocol import CompletionRequest, OutputOptions
from polar.refengine.settings import EngineSettings

# How ``launch`` configures the logits processor inside vLLM's engine process (``forcing``).
POLICY_ENV = "POLAR_VLLM_POLICY"  # JSON {"name", "config", "plugin_modules"}; absent: the model samples freely
LOG_ENV = "POLAR_VLLM_LOG"  # a SampleLog path

# Far above any context a test or demo reaches: vLLM enforces the real limit before the policy is asked.
_UNBOUNDED_LEN = 1 << 30


class PolicyAnswers:
    """A policy (by registry name or ``module:Class``) answering prompts given as token ids."""

    def __init__(self, policy: str, config: Mapping[str, Any], plugin_modules: Sequence[str] = ()) -> None:
        settings = EngineSettings(policy=policy, policy_config=dict(config), max_model_len=_UNBOUNDED_LEN)
        self._tokenizer = load_tokenizer()
        self._generator = Generator(
            settings, self._tokenizer, ChatTemplate(), load_policy(policy, config, tuple(plugin_modules))
        )

    @property
    def end_of_turn(self) -> int:
        return self._tokenizer.eos_token_id

    def target(
        self, prompt_ids: Sequence[int], seed: int | None = None, extra_args: Mapping[str, Any] | None = None
    ) -> tuple[int, ...] | None:
        """The token ids the policy's answer to this prompt is made of (the chat template's end of turn last),
        or None when the policy leaves the turn to the model. ``extra_args`` are the request's ``vllm_xargs``."""
        sampling = SamplingParams(seed=seed, extra_args=dict(extra_args or {}))
        request = CompletionRequest(model=None, prompt=tuple(prompt_ids), sampling=sampling, output=OutputOptions())
        try:
            return tuple(self._generator.answer_ids(self._generator.completion_input(request), always_think=True))
        except ModelSamples:
            return None


class SampleLog:
    """What vLLM fed the model, what it sampled and when, written from inside vLLM to check what a proxy captured
    against. One JSON line per event: ``{"event": "start", "prompt_token_ids", "extra_args", "time"}`` when the
    engine takes a sequence into its batch, ``{"event": "end", "prompt_token_ids", "token_ids", "extra_args",
    "started", "time"}`` when it has sampled its last token (the engine's own account of when it ran, across a
    pause for instance)."""

    def __init__(self, path: str | Path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._handle: TextIO = Path(path).open("a", encoding="utf-8")  # noqa: SIM115 (open for the engine's life)
        self._lock = threading.Lock()

    def start(self, prompt_ids: Sequence[int], extra_args: Mapping[str, Any] | None = None) -> float:
        """A sequence entered the batch; the time it did."""
        now = time.time()
        self._write({"event": "start", "prompt_token_ids": list(prompt_ids), "extra_args": dict(extra_args or {}),
                     "time": now})  # fmt: skip
        return now

    def record(
        self,
        prompt_ids: Sequence[int],
        sampled_ids: Sequence[int],
        extra_args: Mapping[str, Any] | None = None,
        started: float | None = None,
    ) -> None:
        """A sequence was sampled whole (``started``: when it entered the batch)."""
        self._write({"event": "end", "prompt_token_ids": list(prompt_ids), "token_ids": list(sampled_ids),
                     "extra_args": dict(extra_args or {}), "started": started, "time": time.time()})  # fmt: skip

    def _write(self, record: dict[str, Any]) -> None:
        line = json.dumps(record)
        with self._lock:  # one write per line: a reader never sees half of one
            self._handle.write(line + "\n")
            self._handle.flush()


def read_sample_log(path: str | Path, event: str = "end") -> list[dict[str, Any]]:
    """The records of one kind (``end``: sampled sequences; ``start``) of a :class:`SampleLog`, oldest first."""
    if not Path(path).exists():
        return []
    records = (json.loads(line) for line in Path(path).read_text().splitlines() if line.strip())
    return [record for record in records if record.get("event", "end") == event]
