from __future__ import annotations

import pytest

from polar.chat.conversation import Message, ToolCall
from polar.refengine.policies import AssistantTurn, PolicyRequest, ScriptedPolicy

TOOLS = ({"type": "function", "function": {"name": "bash"}},)
CONFIG = {
    "turns": [
        {"reasoning": "look", "tool_calls": [{"name": "bash", "arguments": {"command": "ls"}}], "delay_s": 0.25},
        {"content": "Done."},
    ]
}


def _request(*messages: Message, tool_choice: str = "auto") -> PolicyRequest:
    return PolicyRequest(messages=messages, tools=TOOLS, tool_choice=tool_choice)


def test_default_says_ok() -> None:
    assert ScriptedPolicy({}).respond(_request(Message("user", "hi"))) == AssistantTurn(content="OK.")


def test_turns_follow_the_assistant_count_and_clamp() -> None:
    policy = ScriptedPolicy(CONFIG)
    first = policy.respond(_request(Message("user", "go")))
    assert first == AssistantTurn(reasoning="look", tool_calls=(ToolCall("bash", {"command": "ls"}),), delay_s=0.25)
    history = (Message("user", "go"), Message("assistant", "", "look", first.tool_calls), Message("tool", "a b"))
    assert policy.respond(_request(*history)).content == "Done."
    longer = (*history, Message("assistant", "Done."), Message("user", "again"))
    assert policy.respond(_request(*longer)).content == "Done."


def test_tool_choice_none_drops_calls() -> None:
    turn = ScriptedPolicy(CONFIG).respond(_request(Message("user", "go"), tool_choice="none"))
    assert turn.tool_calls == () and turn.reasoning == "look"


@pytest.mark.parametrize("config", [{"turns": "x"}, {"turns": [1]}, {"turns": [{"tool_calls": [{}]}]}])
def test_bad_config(config: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        ScriptedPolicy(config)
