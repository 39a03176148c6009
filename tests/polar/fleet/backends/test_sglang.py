"""An SGLang ``/generate`` answer read back as a chat completion (``polar.fleet.backends.sglang``): one the engine
malformed is an ``EngineError``, a 502 the proxy records like any engine fault, never an ``IndexError`` or
``TypeError`` and its unrecorded 500 (audit G21)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from polar.errors import EngineError
from polar.fleet.backends import sglang

RECORDED = json.loads((Path(__file__).parents[3] / "contracts" / "sglang" / "generate_response_example.json")
                      .read_text())["body"]  # fmt: skip
PROMPT = list(range(RECORDED["meta_info"]["prompt_tokens"]))


def _answer(**meta: Any) -> dict[str, Any]:
    """The recorded answer with ``meta`` replacing fields of its ``meta_info``."""
    body = copy.deepcopy(RECORDED)
    body["meta_info"].update(meta)
    return body


def test_the_recorded_answer_reads_token_for_token() -> None:
    ids, logprobs = sglang.sampled(RECORDED)
    assert ids == RECORDED["output_ids"] and logprobs[0] == -0.0012 and len(logprobs) == len(ids)
    answer = sglang.as_chat_answer(RECORDED, PROMPT, parse_tools=True)
    assert answer["choices"][0]["token_ids"] == ids and answer["usage"]["prompt_tokens_details"]["cached_tokens"] == 12


@pytest.mark.parametrize(
    "entries",
    [
        [[-0.1]],  # entry[1] missing: an IndexError before
        [[]],
        [None],  # a TypeError before
        ["ab"],  # a string: indexable, still no triple
        [[-0.1, "5", "a"]],  # an id as a string, a float or a bool
        [[-0.1, 5.5, "a"]],
        [[-0.1, True, "a"]],
        [[-0.1, -1, "a"]],
        [["-0.1", 5, "a"]],  # a logprob as a string
        [[None, 5, "a"]],  # no logprob: never read as certain (p=1)
        {"0": [-0.1, 5, "a"]},  # no list at all
    ],
)
def test_a_malformed_sampled_token_is_an_engine_error(entries: Any) -> None:
    body = {"output_ids": [5], "meta_info": {"output_token_logprobs": entries}}
    with pytest.raises(EngineError) as failed:
        sglang.sampled(body)
    assert failed.value.status_code == 502


@pytest.mark.parametrize(
    "body",
    [
        [RECORDED],  # not an object
        {**RECORDED, "meta_info": [1, 2]},
        {**RECORDED, "output_ids": "151667"},
        {**RECORDED, "output_ids": RECORDED["output_ids"][:-1]},  # disagrees with the logprobs
        _answer(output_token_logprobs=[[-0.1, 151667]] * 10 + [[-0.1]]),
        _answer(output_top_logprobs=[[[-0.5]]] * len(RECORDED["output_ids"])),  # an alternative without its id
        _answer(output_top_logprobs=[[[-0.5, 7, "x"]]]),  # one token's alternatives for eleven
        _answer(output_top_logprobs=["x"] * len(RECORDED["output_ids"])),
        _answer(prompt_tokens="14"),
        _answer(cached_tokens="12"),
    ],
)
def test_a_malformed_answer_is_an_engine_error(body: Any) -> None:
    with pytest.raises(EngineError) as failed:
        sglang.as_chat_answer(body, PROMPT, parse_tools=True)
    assert failed.value.status_code == 502


def test_alternatives_read_with_their_text_and_an_alternative_without_a_logprob_as_zero() -> None:
    tops = [[[-0.5, 7, "x"], [None, 8]]] + [None] * (len(RECORDED["output_ids"]) - 1)
    content = sglang.as_chat_answer(_answer(output_top_logprobs=tops), PROMPT, parse_tools=True)["choices"][0]
    first = content["logprobs"]["content"][0]["top_logprobs"]
    assert first == [{"token": "x", "bytes": [120], "logprob": -0.5},
                     {"token": "token_id:8", "bytes": None, "logprob": 0.0}]  # fmt: skip
