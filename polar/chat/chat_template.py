"""ChatML chat template (Qwen2.5/Qwen3 style) with Hermes tool calls and `<think>` reasoning, in plain Python.

    <|im_start|>system\\n{system}\\n\\n{tools block}<|im_end|>\\n
    <|im_start|>user\\n{content}<|im_end|>\\n
    <|im_start|>assistant\\n<think>\\n{reasoning}\\n</think>\\n\\n{content}\\n<tool_call>\\n{json}\\n</tool_call><|im_end|>\\n
    <|im_start|>user\\n<tool_response>\\n{result}\\n</tool_response><|im_end|>\\n
    <|im_start|>assistant\\n

An image renders as `<image>` where it sits in its message (`polar.chat.images`).

`render_assistant_body` is the single place an assistant turn becomes text: the engine samples exactly that text,
and the template writes it again when the turn comes back as history, so prompt + sampled tokens stay a token
prefix of the next prompt (unless earlier reasoning is stripped, as Qwen3 does).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from polar.chat.conversation import Message, ToolCall
from polar.chat.errors import EngineRequestError
from polar.chat.images import with_placeholders
from polar.chat.tokenizer import (
    IM_END,
    IM_START,
    THINK_END,
    THINK_START,
    TOOL_CALL_END,
    TOOL_CALL_START,
    TOOL_RESPONSE_END,
    TOOL_RESPONSE_START,
)

TOOLS_HEADER = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
TOOLS_FOOTER = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call>"
)
GENERATION_PROMPT = f"{IM_START}assistant\n"
EMPTY_THINK = f"{THINK_START}\n\n{THINK_END}\n\n"


def tools_block(tools: Sequence[Mapping[str, Any]]) -> str:
    """The Hermes `# Tools` section listing each tool as one JSON line."""
    lines = "".join("\n" + json.dumps(tool, ensure_ascii=False) for tool in tools)
    return TOOLS_HEADER + lines + TOOLS_FOOTER


def render_tool_call(call: ToolCall) -> str:
    """One `<tool_call>` block as the model writes it."""
    payload = f'{{"name": {json.dumps(call.name, ensure_ascii=False)}, "arguments": {call.arguments_json()}}}'
    return f"{TOOL_CALL_START}\n{payload}\n{TOOL_CALL_END}"


def render_assistant_body(reasoning: str | None, content: str, tool_calls: Sequence[ToolCall] = ()) -> str:
    """The text of an assistant turn between `<|im_start|>assistant\\n` and `<|im_end|>`.

    Normalises as Qwen3's template does (reasoning stripped of surrounding newlines, content of leading ones
    after a think block), plus trailing newlines before tool calls, so what a parser returns renders back the same.
    """
    if reasoning is None and THINK_END in content:
        before, _, content = content.partition(THINK_END)
        reasoning = before.split(THINK_START, 1)[-1]
    text = ""
    if reasoning is not None:
        text = f"{THINK_START}\n{reasoning.strip(chr(10))}\n{THINK_END}\n\n"
        content = content.lstrip("\n")
    if tool_calls:
        content = content.rstrip("\n")
    text += content
    for index, call in enumerate(tool_calls):
        text += ("\n" if index or content else "") + render_tool_call(call)
    return text


@dataclass(frozen=True)
class ChatTemplate:
    """Renders conversations to prompt text; `strip_earlier_reasoning` drops think blocks before the last user turn."""

    strip_earlier_reasoning: bool = False

    def render(
        self,
        messages: Sequence[Message],
        tools: Sequence[Mapping[str, Any]] = (),
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        """The prompt text for `messages`; kwargs `enable_thinking` and `strip_earlier_reasoning` as in Qwen3."""
        kwargs = dict(template_kwargs or {})
        if add_generation_prompt and continue_final_message:
            raise EngineRequestError("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
        if continue_final_message and (not messages or messages[-1].role != "assistant"):
            raise EngineRequestError("continue_final_message requires the final message to be from the assistant")
        strip = bool(kwargs.get("strip_earlier_reasoning", self.strip_earlier_reasoning))
        messages = _strip_reasoning(messages) if strip else list(messages)
        parts: list[str] = []
        if tools:
            first_is_system = bool(messages) and messages[0].role == "system"
            system = _text(messages[0]) + "\n\n" if first_is_system else ""
            parts.append(f"{IM_START}system\n{system}{tools_block(tools)}{IM_END}\n")
            if first_is_system:
                messages = messages[1:]
        for index, message in enumerate(messages):
            previous = messages[index - 1].role if index else None
            following = messages[index + 1].role if index + 1 < len(messages) else None
            parts.append(_render_message(message, previous, following))
        text = "".join(parts)
        if continue_final_message:
            text = text.removesuffix(f"{IM_END}\n")
        if add_generation_prompt:
            text += GENERATION_PROMPT
            if kwargs.get("enable_thinking", True) is False:
                text += EMPTY_THINK
        return text

    def open_prefix(self, messages: Sequence[Message]) -> str:
        """The text an open final assistant message already holds (what continue_final_message continues)."""
        last = messages[-1]
        return render_assistant_body(last.reasoning, last.content, last.tool_calls)


def _render_message(message: Message, previous: str | None, following: str | None) -> str:
    if message.role == "tool":
        opening = f"{IM_START}user" if previous != "tool" else ""
        closing = f"{IM_END}\n" if following != "tool" else ""
        return f"{opening}\n{TOOL_RESPONSE_START}\n{_text(message)}\n{TOOL_RESPONSE_END}{closing}"
    if message.role == "assistant":
        body = render_assistant_body(message.reasoning, message.content, message.tool_calls)
        return f"{IM_START}assistant\n{body}{IM_END}\n"
    return f"{IM_START}{message.role}\n{_text(message)}{IM_END}\n"


def _text(message: Message) -> str:
    """A message's content with `<image>` where its images sit."""
    return with_placeholders(message.content, message.images)


def _strip_reasoning(messages: Sequence[Message]) -> list[Message]:
    """Qwen3 keeps reasoning only for assistant turns after the last user message."""
    last_user = max((i for i, m in enumerate(messages) if m.role == "user"), default=-1)
    out: list[Message] = []
    for index, message in enumerate(messages):
        if message.role == "assistant" and index < last_user:
            content = message.content
            if THINK_END in content:
                content = content.partition(THINK_END)[2].lstrip("\n")
            message = replace(message, reasoning=None, content=content)
        out.append(message)
    return out
