"""Chat messages as frozen values, and their normalisation from the OpenAI chat shape.

The chat template, the policies and the prompt parser all speak `Message`; only this module reads the
loose JSON a client sends (string or text-part content, `developer` as `system`, tool-call arguments as a JSON
string, `reasoning` or `reasoning_content`). An `image_url` part becomes an `ImagePart` of its message
(`polar.chat.images`): `content` keeps the text, the part where in it the image sits.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from polar.chat.errors import MessageFormatError
from polar.chat.images import IMAGE_PART_TYPES, ImagePart, image_part

ROLES = ("system", "user", "assistant", "tool")
_ROLE_ALIASES = {"developer": "system"}


@dataclass(frozen=True)
class ToolCall:
    """One function call of an assistant turn; `arguments` is the parsed JSON value (normally a dict).

    Arguments a client sent that are not valid JSON are kept as the raw string and rendered verbatim.
    """

    name: str
    arguments: Any = field(default_factory=dict)
    id: str | None = None

    def arguments_json(self) -> str:
        """The arguments as the JSON text the template writes and the parser returns."""
        if isinstance(self.arguments, str):
            return self.arguments
        return json.dumps(self.arguments, ensure_ascii=False)


@dataclass(frozen=True)
class Message:
    """One chat message with its content already flattened to text; `images` sit at their offsets in it."""

    role: str
    content: str = ""
    reasoning: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None
    images: tuple[ImagePart, ...] = ()


def normalise_messages(raw: Any) -> tuple[Message, ...]:
    """Turn the `messages` array of a chat request into Messages; MessageFormatError on anything malformed."""
    if not isinstance(raw, list) or not raw:
        raise MessageFormatError("'messages' must be a non-empty list of message objects", param="messages")
    return tuple(_normalise_message(item, index) for index, item in enumerate(raw))


def normalise_tools(raw: Any) -> tuple[Mapping[str, Any], ...]:
    """Validate the `tools` array (OpenAI function tools) and return it unchanged as a tuple."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise MessageFormatError("'tools' must be a list", param="tools")
    for index, tool in enumerate(raw):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise MessageFormatError(
                f"tools[{index}] must be {{'type': 'function', 'function': {{'name': ...}}}}", param="tools"
            )
    return tuple(raw)


def tool_names(tools: Sequence[Mapping[str, Any]]) -> tuple[str, ...]:
    """Names of the offered function tools, in order."""
    return tuple(str(tool["function"]["name"]) for tool in tools)


def _normalise_message(item: Any, index: int) -> Message:
    where = f"messages[{index}]"
    if not isinstance(item, dict):
        raise MessageFormatError(f"{where} must be an object", param="messages")
    role = item.get("role")
    if not isinstance(role, str):
        raise MessageFormatError(f"{where}.role must be a string", param="messages")
    role = _ROLE_ALIASES.get(role, role)
    if role not in ROLES:
        raise MessageFormatError(f"{where}.role {role!r} is not one of {', '.join(ROLES)}", param="messages")
    reasoning = item.get("reasoning")
    if reasoning is None:
        reasoning = item.get("reasoning_content")
    if reasoning is not None and not isinstance(reasoning, str):
        raise MessageFormatError(f"{where}.reasoning must be a string", param="messages")
    tool_call_id = item.get("tool_call_id")
    name = item.get("name")
    content, images = _flatten_content(item.get("content"), where)
    if images and role == "assistant":
        # The model's own turns are text: what it samples must render back as the same text.
        raise MessageFormatError(f"{where}: an assistant message cannot hold images", param="messages")
    return Message(
        role=role,
        content=content,
        images=images,
        reasoning=reasoning if role == "assistant" else None,
        tool_calls=_tool_calls(item.get("tool_calls"), where) if role == "assistant" else (),
        tool_call_id=tool_call_id if isinstance(tool_call_id, str) else None,
        name=name if isinstance(name, str) else None,
    )


def _flatten_content(content: Any, where: str) -> tuple[str, tuple[ImagePart, ...]]:
    if content is None:
        return "", ()
    if isinstance(content, str):
        return content, ()
    if not isinstance(content, list):
        raise MessageFormatError(f"{where}.content must be a string or a list of parts", param="messages")
    texts: list[str] = []
    images: list[ImagePart] = []
    length = 0
    for part in content:
        if isinstance(part, str):
            texts.append(part)
            length += len(part)
            continue
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in IMAGE_PART_TYPES and isinstance(part, dict):
            images.append(image_part(part, where, length))
            continue
        if kind not in ("text", "input_text", "output_text") or not isinstance(part.get("text"), str):
            raise MessageFormatError(
                f"{where}.content part of type {kind!r} is not supported: this model reads text and image_url parts",
                param="messages",
            )
        texts.append(part["text"])
        length += len(part["text"])
    return "".join(texts), tuple(images)


def _tool_calls(raw: Any, where: str) -> tuple[ToolCall, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise MessageFormatError(f"{where}.tool_calls must be a list", param="messages")
    calls: list[ToolCall] = []
    for call in raw:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise MessageFormatError(f"{where}.tool_calls entries need function.name", param="messages")
        arguments: Any = function.get("arguments", "{}")
        if isinstance(arguments, str):
            # vLLM parses the JSON string before templating; keep text that is not JSON verbatim.
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except json.JSONDecodeError:
                pass
        call_id = call.get("id")
        calls.append(ToolCall(function["name"], arguments, call_id if isinstance(call_id, str) else None))
    return tuple(calls)
