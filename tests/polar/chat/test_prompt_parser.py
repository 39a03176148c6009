from __future__ import annotations

from polar.chat.chat_template import ChatTemplate
from polar.chat.conversation import Message, ToolCall
from polar.chat.prompt_parser import parse_prompt

TOOL = {"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}


def test_rendered_conversation_parses_back() -> None:
    messages = (
        Message("system", "Be exact."),
        Message("user", "What is 2 + 2?"),
        Message("assistant", "", "use calc", (ToolCall("calc", {"expression": "2 + 2"}),)),
        Message("tool", "4"),
        Message("tool", "extra"),
    )
    parsed = parse_prompt(ChatTemplate().render(messages, (TOOL,)))
    assert parsed.tools == (TOOL,)
    assert parsed.open_prefix == ""
    assert parsed.messages == (
        *messages[:2],
        Message("assistant", "\n\n", "\nuse calc\n", (ToolCall("calc", {"expression": "2 + 2"}),)),
        Message("tool", "4"),
        Message("tool", "extra"),
    )


def test_open_prefix_of_a_prefilled_turn() -> None:
    parsed = parse_prompt("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert parsed.messages == (Message("user", "hi"),)
    assert parsed.open_prefix == "<think>\n\n</think>\n\n"


def test_closed_prompt_has_no_generation_point() -> None:
    parsed = parse_prompt("<|im_start|>user\nhi<|im_end|>\n")
    assert parsed.open_prefix is None


def test_plain_text_is_one_user_message() -> None:
    parsed = parse_prompt("Once upon a time")
    assert parsed.messages == (Message("user", "Once upon a time"),)
    assert parsed.tools == ()
