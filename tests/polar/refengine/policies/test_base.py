from __future__ import annotations

import pytest

from polar.chat.conversation import Message, ToolCall
from polar.refengine.policies import PolicyRequest
from polar.refengine.policies.base import tool_call_from_config

TOOLS = ({"type": "function", "function": {"name": "a"}}, {"type": "function", "function": {"name": "b"}})


def test_tool_names_respect_tool_choice_none() -> None:
    assert PolicyRequest(messages=(), tools=TOOLS).tool_names == ("a", "b")
    assert PolicyRequest(messages=(), tools=TOOLS, tool_choice="none").tool_names == ()


def test_assistant_turns() -> None:
    request = PolicyRequest(messages=(Message("user", "x"), Message("assistant", "y"), Message("assistant", "z")))
    assert request.assistant_turns() == 2


def test_tool_call_from_config() -> None:
    assert tool_call_from_config({"name": "f", "arguments": {"x": 1}}) == ToolCall("f", {"x": 1})
    with pytest.raises(ValueError):
        tool_call_from_config({"arguments": {}})
