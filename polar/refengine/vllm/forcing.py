"""The logits processor vLLM loads (``--logits-processors polar.refengine.vllm.forcing:PolicyForcing``): it holds each
sequence to the policy's answer for its prompt and logs what was sampled.

It runs inside vLLM's engine process and is configured by environment (``launch`` sets it):
``POLAR_VLLM_POLICY`` (JSON ``{"name", "config", "plugin_modules"}``; absent: the model samples freely) and
``POLAR_VLLM_LOG`` (a :class:`~polar.refengine.vllm.answers.SampleLog` path). Forcing masks every logit but the next
answer token's; vLLM computes the logprobs it returns *before* logits processors run (``logprobs_mode`` is
``raw_logprobs`` by default), so the captured logprobs are the model's own, not the mask's. Everything else — the
chat template, the Hermes tool-call and Qwen3 reasoning parsers, detokenisation, stop rules — is vLLM's.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from typing import Any

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

from polar.refengine.vllm.answers import LOG_ENV, POLICY_ENV, PolicyAnswers, SampleLog

logger = logging.getLogger(__name__)


@dataclass
class _Sequence:
    prompt_ids: list[int]
    output_ids: list[int]  # vLLM's own list: it grows as tokens are sampled
    extra_args: dict[str, Any]
    target: tuple[int, ...] | None = None
    logged: bool = False
    started: float | None = None


class PolicyForcing(LogitsProcessor):
    """Per batch row: the policy's answer ids (or None: free) and the row's sampled ids so far."""

    def __init__(self, vllm_config: object, device: torch.device, is_pin_memory: bool) -> None:
        spec = json.loads(os.environ.get(POLICY_ENV) or "null")
        self._answers = (
            PolicyAnswers(spec["name"], spec.get("config") or {}, spec.get("plugin_modules") or ()) if spec else None
        )
        log_path = os.environ.get(LOG_ENV)
        self._log = SampleLog(log_path) if log_path else None
        self._rows: dict[int, _Sequence] = {}

    @classmethod
    def validate_params(cls, sampling_params: object) -> None:
        return None

    def is_argmax_invariant(self) -> bool:
        return self._answers is None  # forcing changes the argmax; logging alone does not

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        for index in batch_update.removed:
            self._finish(self._rows.pop(index, None))
        for index, params, prompt_ids, output_ids in batch_update.added:
            self._finish(self._rows.pop(index, None))  # an added row may replace one in place
            prompt = list(prompt_ids or [])
            target = self._target(prompt, params)
            extra_args = dict(getattr(params, "extra_args", None) or {})
            started = self._log.start(prompt, extra_args) if self._log is not None else None
            self._rows[index] = _Sequence(prompt, output_ids, extra_args, target, started=started)
        for first, second, kind in batch_update.moved:
            moved, other = self._rows.pop(first, None), self._rows.pop(second, None)
            if moved is not None:
                self._rows[second] = moved
            if kind == MoveDirectionality.SWAP and other is not None:
                self._rows[first] = other
            else:
                # vLLM condenses its batch by moving a row into a removed one's place, and then lists that removal
                # only as this move: the row moved over has ended.
                self._finish(other)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if self._answers is None:
            return logits
        for index, row in self._rows.items():
            if row.target is None or index >= logits.shape[0]:
                continue
            position = len(row.output_ids)
            token = row.target[position] if position < len(row.target) else self._answers.end_of_turn
            logits[index].fill_(float("-inf"))
            logits[index, token] = 0.0
            if position == len(row.target) - 1:
                # The answer's last token: the sequence is whole now. vLLM tells a processor a sequence ended only
                # at its next step, which an idle engine may not take for a while, so the log is written here.
                self._record(row, [*_resolved(row.output_ids, row.target), token])
        return logits

    def _target(self, prompt: list[int], params: object) -> tuple[int, ...] | None:
        if self._answers is None:
            return None
        try:
            return self._answers.target(prompt, getattr(params, "seed", None), getattr(params, "extra_args", None))
        except Exception:  # a broken policy must not take vLLM's engine down: this sequence samples freely
            logger.exception("the policy failed on a prompt of %d tokens; the model samples it", len(prompt))
            return None

    def _finish(self, row: _Sequence | None) -> None:
        """A sequence left the batch (ended, cut by a stop rule or max_tokens, or aborted)."""
        if row is not None and row.output_ids:
            self._record(row, list(row.output_ids))

    def _record(self, row: _Sequence, sampled: list[int]) -> None:
        if self._log is not None and not row.logged:
            row.logged = True
            self._log.record(row.prompt_ids, sampled, row.extra_args, row.started)


def _resolved(output_ids: list[int], target: tuple[int, ...]) -> list[int]:
    """A forced row's sampled ids; under async scheduling vLLM may still hold ``-1`` for the newest one, which
    the mask made the target's token."""
    return [target[i] if token == -1 and i < len(target) else token for i, token in enumerate(output_ids)]
