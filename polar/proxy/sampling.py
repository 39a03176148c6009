"""Sampling parameters on record, and neutralised for on-policy RL.

Every captured call stores ``model_calls.sampling = {"requested": {...}, "used": {...}}``: the sampling fields the
harness asked for (as its request normalised to the OpenAI chat body says them) and the ones the engine was sent,
after the deployment's ``POLAR_SAMPLING_OVERRIDES`` and the task's ``sampling`` mode. A trainer can then tell which
distribution a call's logprobs belong to (docs/training-data.md).

The task field ``sampling`` is ``record`` (the default: send what the harness asked) or ``neutralize``: send
temperature 1 and top_p 1 with no top_k, min_p or penalties, so the tokens are sampled from the policy's own
distribution whatever the harness asks (on-policy RL); what the harness asked is still recorded. Seed and max tokens
are kept: they do not change the distribution.

Whatever the mode, the new tokens a call asks are capped at ``POLAR_MAX_NEW_TOKENS`` (``Config.max_tokens_cap``: by
default what the engine decodes within ``POLAR_ENGINE_TIMEOUT`` at ``POLAR_MIN_DECODE_RATE``), and a call that asks
none is sent the cap: no call can outlive the engine timeout on an engine that decodes at the guaranteed rate. The
cap is part of what was sent (``used``). SGLang's ``max_new_tokens`` and TITO's completions ``max_tokens`` are made
from the capped body; the engine may still be asked less when the prompt leaves less room
(``polar.proxy.service.fit_max_tokens``).
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


LENGTH_FIELDS = ("max_tokens", "max_completion_tokens")


def _as_number(value: Any) -> float | None:
    """A length field's value as the engine would read it (vLLM's request model takes ``"900"`` for 900)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def capped(body: Mapping[str, Any], cap: int) -> dict[str, Any]:
    """``body`` (a chat body) asking at most ``cap`` new tokens (a new dict): each length field it sets to a number
    above the cap is cut to it, and a body that sets neither gets ``max_tokens = cap``. A value that is no number is
    left for the engine to refuse."""
    sent = dict(body)
    asked = [name for name in LENGTH_FIELDS if sent.get(name) is not None]
    if not asked:
        sent["max_tokens"] = cap
    for name in asked:
        number = _as_number(sent[name])
        if number is not None and number > cap:
            sent[name] = cap
    return sent


def engine_sampling(
    requested: Mapping[str, Any], overrides: Mapping[str, Any], mode: str, max_tokens: int | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The chat body to send for a harness's normalised ``requested`` body, and its sampling record; with
    ``max_tokens``, the new tokens asked are capped there (``capped``)."""
    sent = {**requested, **overrides}
    if mode == "neutralize":
        sent = neutralized(sent)
    if max_tokens is not None:
        sent = capped(sent, max_tokens)
    return sent, {"requested": sampling_fields(requested), "used": sampling_fields(sent), "mode": mode}
