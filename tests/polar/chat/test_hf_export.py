"""The exported tokenizer directory renders, through ``transformers``, exactly what the engine's own chat
template renders, and tokenises to the same ids."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from polar.chat.conversation import normalise_tools
from polar.chat.hf_export import export_tokenizer
from polar.chat.tokenizer import Tokenizer
from polar.fleet.renderers import ChatRenderer, template_messages
from polar.refengine import ChatTemplate, normalise_messages

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Wetter für eine Stadt",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
CONVERSATIONS: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": "hi"}],
    [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        {"role": "assistant", "content": "\nHello\n", "reasoning": "\nthink\n"},
        {"role": "user", "content": "again"},
    ],
    [
        {"role": "user", "content": "w?"},
        {
            "role": "assistant",
            "content": "ok\n",
            "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}},
                {"id": "b", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome ü"}'}},
            ],
        },
        {"role": "tool", "tool_call_id": "a", "content": "sunny"},
        {"role": "tool", "tool_call_id": "b", "content": "rain"},
    ],
    [
        {"role": "user", "content": "w?"},
        {"role": "assistant", "content": "<think>x</think>\n\nyo"},
        {"role": "user", "content": "more"},
        {"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "f", "arguments": "not json"}}]},
    ],
]


@pytest.fixture(scope="module")
def renderer(tmp_path_factory: pytest.TempPathFactory) -> ChatRenderer:
    return ChatRenderer.load(str(export_tokenizer(tmp_path_factory.mktemp("tokenizer"))))


@pytest.mark.parametrize("conversation", CONVERSATIONS)
@pytest.mark.parametrize("tools", [None, TOOLS])
@pytest.mark.parametrize("kwargs", [{}, {"enable_thinking": False}, {"strip_earlier_reasoning": True}])
def test_same_text_and_ids_as_the_engine(
    renderer: ChatRenderer, tok: Tokenizer, conversation: list[dict[str, Any]], tools: Any, kwargs: dict[str, Any]
) -> None:
    body = {"messages": conversation, "tools": tools, "chat_template_kwargs": kwargs}
    engine_side = ChatTemplate().render(
        normalise_messages(json.loads(json.dumps(conversation)).copy()),
        normalise_tools(tools) if tools else (),
        True,
        False,
        kwargs,
    )
    assert renderer.prompt_text(body) == engine_side
    assert renderer.prompt_ids(body) == tok.encode(engine_side)


def test_template_messages_are_handed_over_as_vllm_does() -> None:
    (message,) = template_messages(
        [
            {
                "role": "assistant",
                "reasoning": "r",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                "tool_calls": [{"function": {"name": "f", "arguments": '{"x": 1}'}}],
            }
        ]
    )
    assert message == {
        "role": "assistant",
        "reasoning_content": "r",
        "content": "a\nb",
        "tool_calls": [{"function": {"name": "f", "arguments": {"x": 1}}}],
    }


def test_a_directory_without_a_tokenizer_is_a_clear_error(tmp_path: Path) -> None:
    from polar.errors import ValidationError

    with pytest.raises(ValidationError, match="not a tokenizer directory"):
        ChatRenderer.load(str(tmp_path))
