"""A client that asks more new tokens than the context leaves (Claude Code asks 32k-64k whatever the model) is
answered, not refused: on the SGLang path too, the proxy cuts ``max_new_tokens`` to the room the prompt leaves
and asks once more, as the vLLM path does with ``max_tokens`` (AUDIT F15). The reference engine's SGLang mode
refuses as SGLang's tokenizer manager does, in its words."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from polar.fleet.backends.sglang import fit_max_new_tokens
from tests.live_proxy import live_proxy
from tests.processes import HANG_GUARD_S

CONTEXT = 32768  # the reference engine's max_model_len
ANTHROPIC = {"anthropic-version": "2023-06-01", "content-type": "application/json"}


def refusal(prompt: int, asked: int, context: int = CONTEXT) -> str:
    return (f"Requested token count exceeds the model's maximum context length of {context} tokens. You requested a "
            f"total of {prompt + asked} tokens: {prompt} tokens from the input messages and {asked} tokens for the "
            "completion. Please reduce the number of tokens in the input messages or the completion to fit within "
            "the limit.")  # fmt: skip


def generate(asked: int) -> dict[str, Any]:
    return {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": asked, "temperature": 1.0}}


def test_sglangs_refusal_is_fitted_to_the_room_left() -> None:
    fitted = fit_max_new_tokens(generate(32768), 400, refusal(100, 32768))
    assert fitted is not None and fitted["sampling_params"] == {"max_new_tokens": CONTEXT - 100 - 1, "temperature": 1.0}
    assert fit_max_new_tokens(fitted, 400, refusal(100, 32768)) is None  # nothing left to cut: no second retry
    assert fit_max_new_tokens(generate(8), 400, refusal(CONTEXT - 1, 8)) is None  # no room at all
    assert fit_max_new_tokens(generate(8), 400, "The input (40000 tokens) is longer than the model's context") is None
    assert fit_max_new_tokens(generate(32768), 502, refusal(100, 32768)) is None


def test_an_sglang_call_asking_past_the_context_is_answered(database_url: str, tmp_path: Path) -> None:
    # A deployment whose cap on new tokens (POLAR_MAX_NEW_TOKENS) is above the context: the context is what cuts.
    uncapped = {"POLAR_MAX_NEW_TOKENS": str(2 * CONTEXT)}
    with live_proxy(database_url, tmp_path, engine_api="sglang", env=uncapped) as live:
        ids, asked = list(range(5, 205)), CONTEXT - 200  # prompt + max_new_tokens reach the context: SGLang refuses
        sent = {"input_ids": ids, "sampling_params": {"max_new_tokens": asked}}
        refused = httpx.post(f"{live.engine_url}/generate", json=sent, timeout=HANG_GUARD_S)
        assert refused.status_code == 400 and refused.json()["error"]["message"] == refusal(200, asked)

        session_id, key = live.session()
        body = {"model": "m", "max_tokens": 32768, "messages": [{"role": "user", "content": "hi"}]}
        answer = httpx.post(f"{live.base(key)}/v1/messages", json=body, headers=ANTHROPIC, timeout=HANG_GUARD_S)
        assert answer.status_code == 200, answer.text
        (call,) = live.calls(session_id)
        prompt = len(call["prompt_token_ids"])
        assert live.sampling(call, "max_tokens") == CONTEXT - prompt - 1  # what the engine was asked the second time
        assert call["status_code"] == 200 and call["completion_token_ids"]
