from __future__ import annotations

import pytest

from polar.chat.chat_template import TOOLS_FOOTER, TOOLS_HEADER, ChatTemplate, render_assistant_body
from polar.chat.completion_parser import parse_completion
from polar.chat.conversation import Message, ToolCall, normalise_messages
from polar.chat.errors import EngineRequestError
from polar.chat.tokenizer import Tokenizer

TOOL = {"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}


def test_plain_conversation_golden() -> None:
    messages = (Message("system", "Be brief."), Message("user", "Hi"), Message("assistant", "Hello!"))
    text = ChatTemplate().render((*messages, Message("user", "Bye")))
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n"
        "<|im_start|>user\nBye<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_tools_reasoning_and_tool_responses_golden() -> None:
    messages = (
        Message("system", "S"),
        Message("user", "2+2?"),
        Message("assistant", "", "add", (ToolCall("calc", {"e": "2+2"}), ToolCall("calc", {"e": "1"}))),
        Message("tool", "4"),
        Message("tool", "1"),
    )
    text = ChatTemplate().render(messages, (TOOL,))
    assert text == (
        "<|im_start|>system\nS\n\n"
        + TOOLS_HEADER
        + '\n{"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}'
        + TOOLS_FOOTER
        + "<|im_end|>\n"
        "<|im_start|>user\n2+2?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nadd\n</think>\n\n"
        '<tool_call>\n{"name": "calc", "arguments": {"e": "2+2"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "calc", "arguments": {"e": "1"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n4\n</tool_response>\n<tool_response>\n1\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_tools_without_system_get_their_own_system_turn() -> None:
    text = ChatTemplate().render((Message("user", "hi"),), (TOOL,), add_generation_prompt=False)
    assert text.startswith("<|im_start|>system\n# Tools\n\n")
    assert text.endswith("</tool_call><|im_end|>\n<|im_start|>user\nhi<|im_end|>\n")


def test_content_before_tool_calls_is_separated_by_a_newline() -> None:
    body = render_assistant_body(None, "Let me check.\n", (ToolCall("f", {"a": "é"}),))
    assert body == 'Let me check.\n<tool_call>\n{"name": "f", "arguments": {"a": "é"}}\n</tool_call>'


def test_strip_earlier_reasoning_keeps_turns_after_last_user() -> None:
    messages = (
        Message("user", "one"),
        Message("assistant", "A", "old thoughts"),
        Message("user", "two"),
        Message("assistant", "", "new thoughts", (ToolCall("f", {}),)),
        Message("tool", "r"),
    )
    stripped = ChatTemplate(strip_earlier_reasoning=True).render(messages)
    assert "old thoughts" not in stripped and "<|im_start|>assistant\nA<|im_end|>" in stripped
    assert "new thoughts" in stripped
    kept = ChatTemplate().render(messages)
    assert "old thoughts" in kept
    via_kwargs = ChatTemplate().render(messages, template_kwargs={"strip_earlier_reasoning": True})
    assert via_kwargs == stripped


def test_continue_final_message_leaves_the_turn_open() -> None:
    messages = (Message("user", "hi"), Message("assistant", "Sure, here"))
    text = ChatTemplate().render(messages, add_generation_prompt=False, continue_final_message=True)
    assert text.endswith("<|im_start|>assistant\nSure, here")
    with pytest.raises(EngineRequestError, match="Cannot set both"):
        ChatTemplate().render(messages, add_generation_prompt=True, continue_final_message=True)


def test_enable_thinking_false_prefills_an_empty_think_block() -> None:
    text = ChatTemplate().render((Message("user", "hi"),), template_kwargs={"enable_thinking": False})
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


@pytest.mark.parametrize(
    ("reasoning", "content", "calls"),
    [
        (None, "Hello there.", ()),
        ("Think hard.", "Answer.", ()),
        ("\nPadded\n", "\n\nText", ()),
        (None, "", (ToolCall("calc", {"expression": "1 + 2"}),)),
        ("Use tools.", "Calling now.", (ToolCall("a", {"x": [1, 2]}), ToolCall("b", {"y": {"z": None}}))),
        (None, "Ünïcödé 🙂", ()),
    ],
)
def test_rerendered_turn_is_a_token_prefix(
    tok: Tokenizer, reasoning: str | None, content: str, calls: tuple[ToolCall, ...]
) -> None:
    """prompt tokens + sampled tokens == tokens of the next prompt, once the turn comes back as history."""
    template = ChatTemplate()
    history = (Message("user", "What now?"),)
    tools = (TOOL,)
    prompt = template.render(history, tools)
    body = render_assistant_body(reasoning, content, calls)
    sampled = tok.encode(prompt + body + "<|im_end|>")[len(tok.encode(prompt)) :]
    assert tok.encode(prompt) + sampled == tok.encode(prompt + body + "<|im_end|>")
    parsed = parse_completion(body)
    returned = normalise_messages(
        [
            {
                "role": "assistant",
                "content": parsed.content,
                "reasoning": parsed.reasoning,
                "tool_calls": [
                    {"id": f"c{i}", "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                    for i, c in enumerate(parsed.tool_calls)
                ],
            }
        ]
    )
    next_prompt = template.render(history + returned + (Message("user", "thanks"),), tools)
    assert next_prompt.startswith(prompt + body + "<|im_end|>")
    next_ids = tok.encode(next_prompt)
    assert next_ids[: len(tok.encode(prompt)) + len(sampled)] == tok.encode(prompt) + sampled
