"""Reading a ChatML prompt back into a conversation: the inverse of the chat template.

`/v1/completions` receives rendered text (or its token ids). To let a policy answer it, the engine recovers the
messages, the offered tools (from the Hermes block in the system turn) and the generation point: an open final
`<|im_start|>assistant\\n...` turn, whose text so far the completion continues. Text that is not ChatML at all
becomes a single user message.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from polar.chat.chat_template import TOOLS_FOOTER, TOOLS_HEADER
from polar.chat.completion_parser import parse_completion
from polar.chat.conversation import Message, ToolCall
from polar.chat.tokenizer import IM_END, IM_START, TOOL_RESPONSE_END, TOOL_RESPONSE_START

_TOOL_RESPONSE_RE = re.compile(
    r"\n?" + re.escape(TOOL_RESPONSE_START) + r"\n(.*?)\n" + re.escape(TOOL_RESPONSE_END), re.DOTALL
)


@dataclass(frozen=True)
class ParsedPrompt:
    """A conversation recovered from prompt text; `open_prefix` is None unless the prompt ends inside an
    assistant turn, in which case it holds that turn's text so far."""

    messages: tuple[Message, ...]
    tools: tuple[Mapping[str, Any], ...] = ()
    open_prefix: str | None = None


def parse_prompt(text: str) -> ParsedPrompt:
    """Messages, tools and generation point of a ChatML prompt."""
    if IM_START not in text:
        return ParsedPrompt((Message("user", text),), open_prefix="")
    messages: list[Message] = []
    tools: tuple[Mapping[str, Any], ...] = ()
    open_prefix: str | None = None
    segments = text.split(IM_START)[1:]
    for index, segment in enumerate(segments):
        role, _, body = segment.partition("\n")
        closed = IM_END in body
        body = body.split(IM_END, 1)[0]
        if not closed and index == len(segments) - 1 and role == "assistant":
            open_prefix = body
            break
        if role == "system" and not messages and TOOLS_HEADER in body:
            body, tools = _split_tools(body)
        messages.extend(_messages_of(role, body))
    return ParsedPrompt(tuple(messages), tools, open_prefix)


def _split_tools(body: str) -> tuple[str, tuple[Mapping[str, Any], ...]]:
    system, _, rest = body.partition(TOOLS_HEADER)
    listing = rest.split(TOOLS_FOOTER, 1)[0]
    tools: list[Mapping[str, Any]] = []
    for line in listing.splitlines():
        if line.strip():
            try:
                tool = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(tool, dict):
                tools.append(tool)
    return system.removesuffix("\n\n"), tuple(tools)


def _messages_of(role: str, body: str) -> list[Message]:
    if role == "assistant":
        parsed = parse_completion(body)
        calls = tuple(ToolCall(c.name, json.loads(c.arguments)) for c in parsed.tool_calls)
        return [Message("assistant", parsed.content or "", parsed.reasoning, calls)]
    if role == "user" and body.lstrip("\n").startswith(TOOL_RESPONSE_START):
        return [Message("tool", result) for result in _TOOL_RESPONSE_RE.findall(body)]
    if role not in ("system", "user"):
        role = "user"
    return [Message(role, body)]
