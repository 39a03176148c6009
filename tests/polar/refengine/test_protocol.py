from __future__ import annotations

from typing import Any

import pytest

from polar.chat.errors import EngineNotFoundError, EngineRequestError
from polar.refengine.protocol import (
    check_model,
    parse_chat_request,
    parse_completion_request,
    parse_detokenize_request,
    parse_tokenize_request,
)

MESSAGES = [{"role": "user", "content": "hi"}]
TOOLS = [{"type": "function", "function": {"name": "calc"}}]


def test_chat_defaults() -> None:
    request = parse_chat_request({"messages": MESSAGES})
    assert request.tool_choice == "none" and request.add_generation_prompt
    assert request.sampling.max_tokens is None and not request.output.stream
    assert parse_chat_request({"messages": MESSAGES, "tools": TOOLS}).tool_choice == "auto"


def test_chat_fields() -> None:
    request = parse_chat_request(
        {
            "messages": MESSAGES,
            "tools": TOOLS,
            "tool_choice": {"type": "function", "function": {"name": "calc"}},
            "max_completion_tokens": 9,
            "stop": "x",
            "stream": True,
            "stream_options": {"include_usage": True},
            "logprobs": True,
            "top_logprobs": 2,
            "return_token_ids": True,
            "seed": 3,
        }
    )
    assert request.tool_choice == "calc" and request.sampling.max_tokens == 9
    assert request.sampling.stop == ("x",) and request.sampling.seed == 3
    assert request.output.include_usage and request.output.top_logprobs == 2


@pytest.mark.parametrize(
    "body",
    [
        [],
        {},
        {"messages": "hi"},
        {"messages": MESSAGES, "add_generation_prompt": True, "continue_final_message": True},
        {"messages": MESSAGES, "stream_options": {"include_usage": True}},
        {"messages": MESSAGES, "top_logprobs": 2},
        {"messages": MESSAGES, "max_tokens": 0},
        {"messages": MESSAGES, "max_tokens": "5"},
        {"messages": MESSAGES, "temperature": "hot"},
        {"messages": MESSAGES, "n": 2},
        {"messages": MESSAGES, "stop": [1]},
        {"messages": MESSAGES, "tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "x"}}},
        {"messages": MESSAGES, "tool_choice": "auto"},
        {"messages": MESSAGES, "logprobs": "yes"},
    ],
)
def test_chat_rejects(body: Any) -> None:
    with pytest.raises(EngineRequestError):
        parse_chat_request(body)


def test_completion_prompts() -> None:
    assert parse_completion_request({"prompt": [1, 2, 3]}).prompt == (1, 2, 3)
    assert parse_completion_request({"prompt": ["text"]}).prompt == "text"
    request = parse_completion_request({"prompt": "x", "logprobs": 1})
    assert request.sampling.max_tokens == 16 and request.output.logprobs and request.output.top_logprobs == 1
    # A token prompt holds ints only: a bool, a float or a string among them is refused.
    mixed = ({"prompt": [1, True]}, {"prompt": [1, 2.0]}, {"prompt": [1, "2"]})
    for bad in ({"prompt": []}, {"prompt": [[1], [2]]}, {"prompt": 5}, {"prompt": "x", "logprobs": 50}, *mixed):
        with pytest.raises(EngineRequestError):
            parse_completion_request(bad)


def test_tokenize_and_detokenize() -> None:
    assert parse_tokenize_request({"prompt": "x"}).prompt == "x"
    chat = parse_tokenize_request({"messages": MESSAGES, "tools": TOOLS, "return_token_strs": True})
    assert chat.prompt is None and chat.return_token_strs and len(chat.tools) == 1
    assert parse_detokenize_request({"tokens": [1, 2]}) == (1, 2)
    with pytest.raises(EngineRequestError):
        parse_tokenize_request({})
    with pytest.raises(EngineRequestError):
        parse_detokenize_request({"tokens": ["a"]})


def test_check_model() -> None:
    check_model(None, "m")
    check_model("m", "m")
    with pytest.raises(EngineNotFoundError):
        check_model("other", "m")
