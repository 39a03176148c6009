from __future__ import annotations

import pytest

from polar.chat.conversation import Message, ToolCall, normalise_messages, normalise_tools, tool_names
from polar.chat.errors import MessageFormatError


def test_normalises_parts_roles_and_tool_calls() -> None:
    messages = normalise_messages(
        [
            {"role": "developer", "content": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}]},
            {"role": "user", "content": "hi"},
            {
                "role": "assistant",
                "content": None,
                "reasoning_content": "think",
                "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "2"},
        ]
    )
    assert messages[0] == Message("system", "Be brief.")
    assert messages[2] == Message("assistant", "", "think", (ToolCall("f", {"x": 1}, "c1"),))
    assert messages[3].tool_call_id == "c1"


def test_invalid_json_arguments_are_kept_verbatim() -> None:
    (message,) = normalise_messages(
        [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}]}]
    )
    assert message.tool_calls[0].arguments_json() == "{oops"


@pytest.mark.parametrize(
    "raw",
    [
        [],
        "hi",
        [{"role": "wizard", "content": "x"}],
        [{"content": "x"}],
        [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
        [{"role": "user", "content": 5}],
        [{"role": "assistant", "tool_calls": [{"function": {}}]}],
    ],
)
def test_malformed_messages_raise(raw: object) -> None:
    with pytest.raises(MessageFormatError):
        normalise_messages(raw)


def test_tools_are_validated() -> None:
    tools = normalise_tools([{"type": "function", "function": {"name": "calc"}}])
    assert tool_names(tools) == ("calc",)
    assert normalise_tools(None) == ()
    with pytest.raises(MessageFormatError):
        normalise_tools([{"type": "function"}])
