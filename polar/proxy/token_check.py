"""Whether an engine's answer carries what token-exact capture needs: the prompt's ids, the sampled ids and one
logprob per sampled id (docs/training-data.md).

An answer without them is an engine failure, not a good call: stored as one, its gaps would be filled later (a
completion missing from the chain becomes interstitial tokens, missing logprobs read as p=1) and the importance
ratios a trainer computes would be wrong with nothing saying so. Engines that answer so: vLLM before 0.10.2 (no
``return_token_ids``), gpt-oss on vLLM 0.10.2-0.11.0 (``token_ids: null``), an engine that drops
``logprobs.content``. The proxy answers the harness 502 in its own protocol and records the call as failed by the
engine, so postrun classes the attempt ``engine_failed`` (infrastructure, retried).
"""

from __future__ import annotations

import math
from typing import Any

from polar.errors import EngineError
from polar.storage.prompts import TokenIds


def _ids(value: Any) -> bool:
    """A non-empty list of plain ints (no bools): one C-level pass over the types, not a Python loop over the ids
    (32k prompt ids: ~0.3 ms, not ~2.5); none for ids read as such already (``TokenIds``)."""
    if type(value) is TokenIds:
        return bool(value)
    return isinstance(value, list) and bool(value) and set(map(type, value)) == {int}


def token_gap(body: Any) -> str | None:
    """What a 200 chat completion (vLLM shape, as the proxy reads every engine's answer) lacks for capture, or
    None when it is whole."""
    choices = body.get("choices") if isinstance(body, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return "no choices"
    choice = choices[0]
    if not _ids(body.get("prompt_token_ids")):
        return "no prompt_token_ids"
    if not _ids(choice.get("token_ids")):
        return "no token_ids for the completion"
    content = (choice.get("logprobs") or {}).get("content") if isinstance(choice.get("logprobs"), dict) else None
    if not isinstance(content, list):
        return "no logprobs for the completion"
    if len(content) != len(choice["token_ids"]):
        return f"{len(content)} logprobs for {len(choice['token_ids'])} completion tokens"
    for entry in content:
        logprob = entry.get("logprob") if isinstance(entry, dict) else None
        if not isinstance(logprob, int | float) or isinstance(logprob, bool) or math.isnan(logprob) or logprob > 1e-3:
            return f"a completion token without a valid logprob ({logprob!r})"
    return None


def check_tokens(body: Any) -> None:
    """Raise ``EngineError`` (502) when ``body`` lacks the ids or logprobs capture needs."""
    gap = token_gap(body)
    if gap is not None:
        raise EngineError(
            f"the engine's answer is missing what token-exact capture needs ({gap}); Polar does not pad it. "
            "Use an engine that returns token ids and logprobs (docs/engines.md)",
            status_code=502,
        )
