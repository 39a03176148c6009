"""Splitting sampled text into reasoning, content and tool calls, as vLLM's parsers do.

Reasoning follows the Qwen3 `<think>` parser: text before `</think>` (without `<think>`) is reasoning, text after
is content; a completion cut inside the think block is all reasoning. Tool calls follow vLLM's Hermes parser:
each `<tool_call>{json}</tool_call>` (or an unterminated final one) becomes a call, the text before the first
becomes content, and if any block fails to parse as JSON nothing is a tool call. Newlines are returned raw, as
vLLM does; the chat template strips them when the turn comes back as history.

`parse_partial` is the streaming view: what a prefix of the completion shows so far; `chat_message` the OpenAI
chat message a completion stands for (what the proxy answers when it asked an engine for tokens, not chat).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from polar.chat.tokenizer import THINK_END, THINK_START, TOOL_CALL_END, TOOL_CALL_START

_TOOL_CALL_RE = re.compile(
    re.escape(TOOL_CALL_START) + r"(.*?)" + re.escape(TOOL_CALL_END) + "|" + re.escape(TOOL_CALL_START) + r"(.*)",
    re.DOTALL,
)
_CALL_HEAD_RE = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*', re.DOTALL)


@dataclass(frozen=True)
class ParsedToolCall:
    """A tool call as vLLM returns it: the function name and its arguments as a JSON string."""

    name: str
    arguments: str


@dataclass(frozen=True)
class ParsedCompletion:
    """The message fields vLLM derives from a completion's text."""

    reasoning: str | None
    content: str | None
    tool_calls: tuple[ParsedToolCall, ...] = ()


@dataclass(frozen=True)
class PartialCompletion:
    """What a prefix of a completion shows: text so far, and per tool call its name (once known) and arguments."""

    reasoning: str
    content: str
    tool_calls: tuple[tuple[str | None, str], ...] = ()


def split_reasoning(text: str) -> tuple[str | None, str]:
    """(reasoning, rest) per the `<think>` parser; reasoning is None when the text has no think block."""
    if THINK_END in text:
        before, _, after = text.partition(THINK_END)
        return before.split(THINK_START, 1)[-1], after
    if text.startswith(THINK_START):
        return text[len(THINK_START) :], ""
    return None, text


def split_tool_calls(text: str) -> tuple[str, tuple[ParsedToolCall, ...]]:
    """(content before the first call, calls) per the Hermes parser; no calls if any block is not valid JSON."""
    if TOOL_CALL_START not in text:
        return text, ()
    calls: list[ParsedToolCall] = []
    for closed, unclosed in _TOOL_CALL_RE.findall(text):
        try:
            payload = json.loads(closed or unclosed)
        except json.JSONDecodeError:
            return text, ()
        if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
            return text, ()
        arguments = json.dumps(payload.get("arguments", {}), ensure_ascii=False)
        calls.append(ParsedToolCall(payload["name"], arguments))
    return text[: text.index(TOOL_CALL_START)], tuple(calls)


def parse_completion(text: str, parse_tools: bool = True) -> ParsedCompletion:
    """Reasoning, content and (when tools are enabled for the request) tool calls of a completion."""
    reasoning, rest = split_reasoning(text)
    calls: tuple[ParsedToolCall, ...] = ()
    if parse_tools:
        rest, calls = split_tool_calls(rest)
    content: str | None = rest
    if not rest and (reasoning is not None or calls):
        content = None
    return ParsedCompletion(reasoning, content, calls)


def parse_partial(text: str, parse_tools: bool = True) -> PartialCompletion:
    """The streaming view of a completion prefix; argument text is held back while it could be the closing brace."""
    reasoning, rest = split_reasoning(text)
    if not parse_tools or TOOL_CALL_START not in rest:
        return PartialCompletion(reasoning or "", rest)
    content, _, calls_text = rest.partition(TOOL_CALL_START)
    calls: list[tuple[str | None, str]] = []
    for block in calls_text.split(TOOL_CALL_START):
        body, closed, _ = block.partition(TOOL_CALL_END)
        head = _CALL_HEAD_RE.match(body)
        if head is None:
            calls.append((None, ""))
            continue
        name = json.loads(f'"{head.group(1)}"')
        arguments = body[head.end() :].rstrip()
        # Once closed, exactly one brace belongs to the outer object; before that, hold back any trailing
        # braces, since any of them may turn out to be the outer one.
        arguments = arguments.removesuffix("}") if closed else arguments.rstrip("}")
        calls.append((name, arguments.rstrip()))
    return PartialCompletion(reasoning or "", content, tuple(calls))


def chat_message(text: str, parse_tools: bool) -> dict[str, Any]:
    """The assistant ``message`` of a vLLM chat completion for sampled ``text``: content, reasoning and tool
    calls with fresh ids, as vLLM's ``ChatMessage`` has them."""
    parsed = parse_completion(text, parse_tools=parse_tools)
    calls = [
        {"id": f"chatcmpl-tool-{uuid.uuid4().hex}", "type": "function",
         "function": {"name": call.name, "arguments": call.arguments}}
        for call in parsed.tool_calls
    ]  # fmt: skip
    return {"role": "assistant", "content": parsed.content, "reasoning": parsed.reasoning, "tool_calls": calls}
