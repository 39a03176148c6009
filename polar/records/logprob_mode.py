"""Whether an engine's logprobs are raw or processed, found by asking it (kept in a batch's provenance).

Raw logprobs are the model's distribution before the sampling processors (temperature, top-p/top-k, penalties):
vLLM's default (``--logprobs-mode raw_logprobs``) and ``polar engine``'s. Processed ones are the distribution the
token was actually sampled from (vLLM's ``processed_logprobs``). A trainer computing importance ratios needs to know
which it holds whenever a harness samples at a temperature other than 1.

The probe asks for one token of the same prompt with the same seed twice, at temperature 1 and at 0.5, with the
top alternatives at the first position, and compares the logprobs of the tokens both answers list: raw logprobs do
not move with temperature, processed ones do (at temperature 0.5 a token's logprob is twice its logit less the new
normaliser, so every alternative but a near-certain one moves by far more than the engines' numerical noise).
"""

from __future__ import annotations

import uuid
from typing import Any, Literal

import httpx

LogprobMode = Literal["raw", "processed"]
PROMPT = [{"role": "user", "content": "Name one colour."}]
TOP = 5
SEED = 1234
# Raw logprobs agree to ~1e-3 across batches (batch-variant kernels); temperature 0.5 moves alternatives by > 0.5.
TOLERANCE = 0.05
# The probe's requests name themselves (vLLM and ``polar engine`` take ``request_id``), so an engine log or an audit
# can tell them from harness calls: they are Polar's, never captured as a session's.
REQUEST_PREFIX = "polar-logprob-probe-"


def probe_body(model: str, temperature: float) -> dict[str, Any]:
    return {
        "model": model, "messages": PROMPT, "max_tokens": 1, "temperature": temperature, "top_p": 1.0, "seed": SEED,
        "logprobs": True, "top_logprobs": TOP, "request_id": f"{REQUEST_PREFIX}{uuid.uuid4().hex}",
    }  # fmt: skip


def first_position(answer: Any) -> dict[str, float]:
    """The first completion token's listed alternatives (token text -> logprob), the sampled token among them."""
    try:
        entry = answer["choices"][0]["logprobs"]["content"][0]
    except (KeyError, IndexError, TypeError) as exc:
        raise ValueError("the answer has no logprobs.content") from exc
    listed = {str(alt["token"]): float(alt["logprob"]) for alt in entry.get("top_logprobs") or []}
    listed.setdefault(str(entry["token"]), float(entry["logprob"]))
    return listed


def compare(at_one: Any, at_half: Any) -> LogprobMode:
    """``raw`` or ``processed`` from the answers at temperature 1 and 0.5; ValueError when they share no token."""
    first, second = first_position(at_one), first_position(at_half)
    shared = [token for token in first if token in second]
    if not shared:
        raise ValueError("the two answers list no common token")
    moved = max(abs(first[token] - second[token]) for token in shared)
    return "processed" if moved > TOLERANCE else "raw"


def probe(client: httpx.Client, url: str) -> dict[str, Any]:
    """``{"logprob_mode": "raw" | "processed" | None, "logprob_mode_error": str | None}`` for the engine at ``url``
    (its base URL, no kind prefix); httpx errors become the error, never raise."""
    try:
        models = client.get(url + "/v1/models").json()["data"]
        model = str(models[0]["id"])
        answers = []
        for temperature in (1.0, 0.5):
            response = client.post(url + "/v1/chat/completions", json=probe_body(model, temperature))
            if response.status_code != 200:
                raise ValueError(f"/v1/chat/completions answered {response.status_code}")
            answers.append(response.json())
        return {"logprob_mode": compare(*answers), "logprob_mode_error": None}
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
        return {"logprob_mode": None, "logprob_mode_error": f"{type(exc).__name__}: {exc}"[:300]}
