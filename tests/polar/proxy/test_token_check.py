"""What an engine answer must carry for token-exact capture (audit F5): every gap is named, none is padded."""

from __future__ import annotations

import pytest

from polar.errors import EngineError
from polar.fleet.backends import sglang
from polar.proxy.token_check import check_tokens, token_gap
from tests.e2e.tokenless_engine import answer


def test_a_whole_answer_passes() -> None:
    assert token_gap(answer("whole")) is None
    check_tokens(answer("whole"))


@pytest.mark.parametrize(
    ("prompt", "gap"),
    [("no-ids", "no prompt_token_ids"), ("no-logprobs", "no logprobs"), ("short-logprobs", "2 logprobs for 3")],
)
def test_each_gap_is_an_engine_failure(prompt: str, gap: str) -> None:
    assert gap in str(token_gap(answer(prompt)))
    with pytest.raises(EngineError) as failed:
        check_tokens(answer(prompt))
    assert failed.value.status_code == 502 and gap in str(failed.value)


def test_null_ids_and_bad_logprobs_are_gaps() -> None:
    body = answer("whole")
    body["choices"][0]["token_ids"] = None  # gpt-oss on vLLM 0.10.2-0.11.0
    assert token_gap(body) == "no token_ids for the completion"
    body = answer("whole")
    body["choices"][0]["logprobs"]["content"][1]["logprob"] = None
    assert "without a valid logprob" in str(token_gap(body))


def test_an_sglang_token_without_logprob_is_not_read_as_certain() -> None:
    body = {"output_ids": [5, 6], "meta_info": {"output_token_logprobs": [[-0.1, 5, "a"], [None, 6, "b"]]}}
    with pytest.raises(EngineError):
        sglang.sampled(body)
