"""Sampling parameters on record, and neutralised for on-policy RL.

Every captured call stores ``model_calls.sampling = {"requested": {...}, "used": {...}}``: the sampling fields the
harness asked for (as its request normalised to the OpenAI chat body says them) and the ones the engine was sent,
after the deployment's ``POLAR_SAMPLING_OVERRIDES`` and the task's ``sampling`` mode. A trainer can then tell which
distribution a call's logprobs belong to (docs/training-data.md).

The task field ``sampling`` is ``record`` (the default: send what the harness asked) or ``neutralize``: send
temperature 1 and top_p 1 with no top_k, min_p or penalties, so the tokens are sampled from the policy's own
distribution whatever the harness asks (on-policy RL); what the harness asked is still recorded. Seed and max tokens
are kept: they do not change the distribution.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

SamplingMode = Literal["record", "neutralize"]
MODES: tuple[SamplingMode, ...] = ("record", "neutralize")

FIELDS = (
    "temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty", "seed",
    "max_tokens", "max_completion_tokens",
)  # fmt: skip
NEUTRAL: dict[str, Any] = {"temperature": 1.0, "top_p": 1.0}
DROPPED_WHEN_NEUTRAL = ("top_k", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty")


def sampling_fields(body: Mapping[str, Any]) -> dict[str, Any]:
    """The sampling fields ``body`` (an OpenAI chat body) sets, in ``FIELDS`` order."""
    return {name: body[name] for name in FIELDS if body.get(name) is not None}


def neutralized(body: Mapping[str, Any]) -> dict[str, Any]:
    """``body`` as sent under ``sampling: neutralize`` (a new dict)."""
    sent = {name: value for name, value in body.items() if name not in DROPPED_WHEN_NEUTRAL}
    return {**sent, **NEUTRAL}


def engine_sampling(
    requested: Mapping[str, Any], overrides: Mapping[str, Any], mode: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The chat body to send for a harness's normalised ``requested`` body, and its sampling record."""
    sent = {**requested, **overrides}
    if mode == "neutralize":
        sent = neutralized(sent)
    return sent, {"requested": sampling_fields(requested), "used": sampling_fields(sent), "mode": mode}
