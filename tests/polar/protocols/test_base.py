"""``polar.protocols._base.continued_answer``: a continued content prefill's answer, which vLLM's ``qwen3`` parser
filed as reasoning, is shown as content; every other answer stays as the engine gave it."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from polar.protocols._base import EngineAnswer, continued_answer

QUESTION = {"role": "user", "content": "Where is it sunny?"}


def _continuing(prefill: Any, **assistant: Any) -> dict[str, Any]:
    last = {"role": "assistant", "content": prefill, **assistant}
    return {"messages": [QUESTION, last], "continue_final_message": True, "add_generation_prompt": False}


def _answer(reasoning: str | None = " sunny today.", content: str | None = None) -> EngineAnswer:
    message = {"role": "assistant", "content": content, "reasoning": reasoning, "reasoning_content": reasoning}
    choice = {"index": 0, "message": message, "finish_reason": "stop", "token_ids": [5, 6, 2]}
    second = {"index": 1, "message": dict(message), "finish_reason": "length", "token_ids": [7]}
    return EngineAnswer({"id": "chatcmpl-1", "choices": [choice, second], "prompt_token_ids": [1, 2, 3]})


@pytest.mark.parametrize(
    "prefill",
    [
        "Paris is",
        [{"type": "text", "text": "Paris "}, {"type": "text", "text": "is"}],
        "<think>\nhm\n</think>\n\nIt is",
    ],
    ids=["string", "text-parts", "after-closed-think"],
)
def test_a_continued_content_prefill_gets_its_reasoning_as_content(prefill: Any) -> None:
    answer = _answer()
    shown = continued_answer(_continuing(prefill), answer)
    assert shown.message == {"role": "assistant", "content": " sunny today."}
    assert shown.reasoning is None and shown.content == " sunny today."
    assert {k: v for k, v in shown.choice.items() if k != "message"} == {
        "index": 0, "finish_reason": "stop", "token_ids": [5, 6, 2]
    }  # fmt: skip
    assert shown.body["choices"][1] == answer.body["choices"][1]
    assert {k: v for k, v in shown.body.items() if k != "choices"} == {
        "id": "chatcmpl-1",
        "prompt_token_ids": [1, 2, 3],
    }


@pytest.mark.parametrize(
    "engine_body",
    [
        _continuing("<think>\nLet me"),  # an open think block: the continuation is reasoning
        _continuing("<think>a</think>It is <think>b"),
        _continuing("", reasoning="First, the map."),  # a reasoning-only prefill
        _continuing(None, reasoning="First, the map."),
        _continuing([{"type": "text", "text": ""}]),
        {"messages": [QUESTION], "continue_final_message": False},
        {"messages": [QUESTION]},
        {"messages": [], "continue_final_message": True},
    ],
    ids=["open-think", "reopened-think", "reasoning-only", "no-content", "empty-parts", "not-continued",
         "plain", "no-messages"],
)  # fmt: skip
def test_other_requests_keep_the_answer(engine_body: dict[str, Any]) -> None:
    answer = _answer()
    assert continued_answer(engine_body, answer) is answer


@pytest.mark.parametrize("answer", [_answer(content=" sunny."), _answer(reasoning=None, content=" sunny.")])
def test_answers_with_content_or_without_reasoning_are_kept(answer: EngineAnswer) -> None:
    assert continued_answer(_continuing("Paris is"), answer) is answer


def test_inputs_are_never_mutated() -> None:
    engine_body, answer = _continuing([{"type": "text", "text": "Paris is"}]), _answer()
    before = copy.deepcopy((engine_body, answer.body))
    shown = continued_answer(engine_body, answer)
    assert shown.content and (engine_body, answer.body) == before


def test_reasoning_under_vllms_older_name_is_moved_too() -> None:
    answer = EngineAnswer({"choices": [{"message": {"role": "assistant", "reasoning_content": " sunny."}}]})
    assert continued_answer(_continuing("Paris is"), answer).message == {"role": "assistant", "content": " sunny."}
