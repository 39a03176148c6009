"""Anthropic Messages (``/v1/messages``, Claude Code's protocol): content blocks in, content blocks out.

Requests become OpenAI chat bodies: ``system`` (string or text blocks, Claude Code's per-request billing line
removed) becomes the first system message, ``thinking`` blocks an assistant's ``reasoning``, ``tool_use`` blocks
``tool_calls`` and each ``tool_result`` block a ``tool`` message; a trailing assistant turn is a prefill. Answers
become ``thinking`` / ``text`` / ``tool_use`` blocks; ``anthropic_stream`` turns that message into the event stream.

Tool-call ids: the engine's ids (``chatcmpl-tool-<hex>``) are the client's ids unchanged. An engine id outside
Anthropic's ``^[a-zA-Z0-9_-]+$`` is sent as ``polarb64_<base64url(id)>`` and decoded when it comes back, so the
mapping needs no state and the engine always sees its own ids again.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import uuid
from collections.abc import Iterator
from typing import Any

from polar.errors import ValidationError
from polar.protocols import anthropic_stream, images
from polar.protocols._base import (
    ClientRequest,
    EngineAnswer,
    RequestContext,
    assistant_message,
    parse_arguments,
    route,
)

PROVIDER = "anthropic"
ROUTES = (
    route("POST", r"/v1/messages", "generate"),
    route("POST", r"/v1/messages/count_tokens", "count_tokens"),
    route("GET", r"/v1/models", "models"),
    route("HEAD", r"/", "head"),
)

MAX_TOKENS = 32768
UNSUPPORTED_DOCUMENT = "document input is not supported by this model (text and images only)"
TOOL_ID = re.compile(r"^[a-zA-Z0-9_-]+$")
ENCODED_ID = "polarb64_"
# Claude Code (≥2.1.x) opens ``system`` with ``x-anthropic-billing-header: cc_version=…; cch=<hash>;``, which
# changes every call: left in, no two prompts of a session would share a prefix.
BILLING_LINE = re.compile(r"^x-anthropic-billing-header:[^\n]*(?:\n|$)", re.MULTILINE)
TOOL_CHOICES = {"auto": "auto", "any": "required", "none": "none"}


def _fail(message: str, field: str | None = None) -> ValidationError:
    return ValidationError(f"{field}: {message}" if field else message, field=field)


def _number(body: dict[str, Any], name: str) -> float | None:
    value = body.get(name)
    if value is not None and (not isinstance(value, int | float) or isinstance(value, bool)):
        raise _fail("must be a number", name)
    return value


def _positive_int(value: Any, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise _fail("required, an integer of at least 1", name)
    return value


# --- tool-call ids -------------------------------------------------------------------------------------------


def client_tool_id(engine_id: str) -> str:
    """The id the client sees for an engine tool-call id (unchanged when Anthropic's pattern allows it)."""
    if TOOL_ID.fullmatch(engine_id) and not engine_id.startswith(ENCODED_ID):
        return engine_id
    return ENCODED_ID + base64.urlsafe_b64encode(engine_id.encode()).decode().rstrip("=")


def engine_tool_id(client_id: str) -> str:
    """The inverse of ``client_tool_id``; ids the proxy never minted pass through."""
    if not client_id.startswith(ENCODED_ID):
        return client_id
    encoded = client_id[len(ENCODED_ID) :]
    try:
        decoded = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode()
    except (ValueError, UnicodeDecodeError):
        return client_id
    return decoded if client_tool_id(decoded) == client_id else client_id


# --- request -------------------------------------------------------------------------------------------------


def _blocks(content: Any, where: str, media: bool = False) -> list[dict[str, Any]]:
    """Content blocks (a string is one text block); ``image`` blocks only where ``media`` allows them."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise _fail("must be a string or an array of content blocks", where)
    for index, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise _fail("must be a content block object with a type", f"{where}[{index}]")
        if block["type"] == "document":
            raise _fail(UNSUPPORTED_DOCUMENT, f"{where}[{index}]")
        if block["type"] == "image" and not media:
            raise _fail("image blocks are only accepted in user messages and tool results", f"{where}[{index}]")
        if block["type"] == "text" and not isinstance(block.get("text"), str):
            raise _fail("text: required, a string", f"{where}[{index}]")
    return content


def _system(system: Any) -> str | None:
    if system is None:
        return None
    texts = [BILLING_LINE.sub("", block["text"]) for block in _blocks(system, "system") if block["type"] == "text"]
    if len(texts) != (1 if isinstance(system, str) else len(system)):
        raise _fail("only text blocks are allowed", "system")
    return "\n".join(text for text in texts if text) or None


def _image(block: dict[str, Any], where: str, found: images.Found, origin: str) -> dict[str, Any]:
    """An ``image`` block as a chat image part: a ``base64`` or ``url`` source (``file`` needs a file store)."""
    raw = block.get("source")
    source: dict[str, Any] = raw if isinstance(raw, dict) else {}
    kind = source.get("type")
    if kind == "base64":
        chat, image = images.from_base64(source.get("data"), source.get("media_type"), f"{where}.source.data", origin)
    elif kind == "url":
        chat, image = images.from_url(source.get("url"), f"{where}.source.url", origin)
    elif kind == "file":
        raise _fail("file sources are not supported (this proxy has no file store); send the image as base64",
                    f"{where}.source")  # fmt: skip
    else:
        raise _fail("required, {type: 'base64', media_type, data} or {type: 'url', url}", f"{where}.source")
    found.append((chat, image))
    return chat


def _tool_result(block: dict[str, Any], where: str, found: images.Found) -> tuple[dict[str, Any], list[Any]]:
    """The tool message (its text blocks only) and the result's images as chat parts, for a user message after
    the turn's tool messages."""
    tool_use_id = block.get("tool_use_id")
    if not isinstance(tool_use_id, str) or not tool_use_id:
        raise _fail("tool_use_id: required, a string", where)
    content = block.get("content")
    texts: list[str] = []
    moved: list[Any] = []
    for index, part in enumerate(_blocks(content, f"{where}.content", media=True) if content is not None else []):
        if part["type"] == "image":
            moved.append(_image(part, f"{where}.content[{index}]", found, "tool_result"))
            continue
        if part["type"] != "text":
            raise _fail(f"a tool_result may hold only text and image blocks, not {part['type']!r}",
                        f"{where}.content[{index}]")  # fmt: skip
        texts.append(part["text"])
    text = "\n".join(texts)
    if block.get("is_error"):
        text = f"Error: {text}" if text else "Error"
    return {"role": "tool", "tool_call_id": engine_tool_id(tool_use_id), "content": text}, moved


def _user_messages(content: Any, where: str, found: images.Found) -> list[dict[str, Any]]:
    """A user turn: text and image blocks between tool results become user messages of their own, in order.

    Images inside tool results open the turn's last user message, after its last tool message: the tool
    messages must follow the assistant's calls with nothing between them."""
    messages: list[dict[str, Any]] = []
    pieces: list[str | dict[str, Any]] = []
    moved: list[str | dict[str, Any]] = []
    for index, block in enumerate(_blocks(content, f"{where}.content", media=True)):
        kind, at = block["type"], f"{where}.content[{index}]"
        if kind == "text":
            pieces.append(block["text"])
        elif kind == "image":
            pieces.append(_image(block, at, found, "user"))
        elif kind == "tool_result":
            if pieces:
                messages.append({"role": "user", "content": images.content(pieces)})
                pieces = []
            tool, parts = _tool_result(block, at, found)
            messages.append(tool)
            moved += parts
        else:
            raise _fail(f"block type {kind!r} is not allowed in a user message", at)
    pieces = [*moved, *pieces]
    if pieces or not messages:
        messages.append({"role": "user", "content": images.content(pieces)})
    return messages


def _tool_call(block: dict[str, Any], where: str) -> dict[str, Any]:
    if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
        raise _fail("tool_use needs a string id and name", where)
    raw = block.get("input", {})
    arguments = raw if isinstance(raw, str) else json.dumps(raw, ensure_ascii=False)
    function = {"name": block["name"], "arguments": arguments}
    return {"id": engine_tool_id(block["id"]), "type": "function", "function": function}


def _assistant_message(content: Any, where: str) -> dict[str, Any]:
    texts: list[str] = []
    reasoning: list[str] = []
    calls: list[dict[str, Any]] = []
    for index, block in enumerate(_blocks(content, f"{where}.content")):
        kind, at = block["type"], f"{where}.content[{index}]"
        if kind == "text":
            texts.append(block["text"])
        elif kind == "thinking":
            reasoning.append(str(block.get("thinking") or ""))
        elif kind == "tool_use":
            calls.append(_tool_call(block, at))
        elif kind != "redacted_thinking":  # opaque to anyone but Anthropic: nothing to replay
            raise _fail(f"block type {kind!r} is not allowed in an assistant message", at)
    return assistant_message("".join(texts), "\n".join(reasoning), calls)


def _messages(body: dict[str, Any], found: images.Found) -> list[dict[str, Any]]:
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise _fail("required, a non-empty array", "messages")
    system = _system(body.get("system"))
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    for index, message in enumerate(raw):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise _fail("must be an object", where)
        if message.get("role") == "user":
            messages.extend(_user_messages(message.get("content"), where, found))
        elif message.get("role") == "assistant":
            messages.append(_assistant_message(message.get("content"), where))
        elif message.get("role") == "system":
            # Claude Code (2.1.19x) sends agent and skill listings as system messages between turns; keep them
            # where they stand (the chat template renders a system turn there) rather than refuse the request.
            text = _system(message.get("content"))
            if text:
                messages.append({"role": "system", "content": text})
        else:
            raise _fail("must be 'user', 'assistant' or 'system'", f"{where}.role")
    if not messages:  # only system messages, each empty: nothing to render
        raise _fail("no message with content", "messages")
    return messages


def _tools(raw: Any) -> list[dict[str, Any]]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise _fail("must be an array", "tools")
    tools = []
    for index, tool in enumerate(raw):
        where = f"tools[{index}]"
        if not isinstance(tool, dict):
            raise _fail("must be an object", where)
        if tool.get("type") not in (None, "custom"):
            raise _fail(f"tool type {tool['type']!r} is not supported: only custom tools with an input_schema", where)
        if not isinstance(tool.get("name"), str) or not tool["name"] or not isinstance(tool.get("input_schema"), dict):
            raise _fail("needs a name and an input_schema object", where)
        function: dict[str, Any] = {"name": tool["name"]}
        if isinstance(tool.get("description"), str):
            function["description"] = tool["description"]
        function["parameters"] = tool["input_schema"]
        tools.append({"type": "function", "function": function})
    return tools


def _tool_choice(raw: Any) -> tuple[str | dict[str, Any], bool]:
    """The OpenAI tool_choice, and whether parallel tool calls stay allowed."""
    if not isinstance(raw, dict) or raw.get("type") not in (*TOOL_CHOICES, "tool"):
        raise _fail("must be {'type': 'auto' | 'any' | 'none' | 'tool'}", "tool_choice")
    parallel = not raw.get("disable_parallel_tool_use")
    if raw["type"] != "tool":
        return TOOL_CHOICES[raw["type"]], parallel
    if not isinstance(raw.get("name"), str):
        raise _fail("a 'tool' choice needs the tool's name", "tool_choice.name")
    return {"type": "function", "function": {"name": raw["name"]}}, parallel


def _thinking(raw: Any) -> dict[str, Any]:
    """``chat_template_kwargs`` for the thinking setting; ``adaptive``, ``between_tools`` and any newer kind
    leave the model's default (on for Qwen3-style templates)."""
    if raw is None:
        return {}
    if not isinstance(raw, dict) or not isinstance(raw.get("type"), str):
        raise _fail("must be {'type': 'enabled' | 'disabled' | 'adaptive', ...}", "thinking")
    if raw["type"] not in ("enabled", "disabled"):
        return {}
    return {"chat_template_kwargs": {"enable_thinking": raw["type"] == "enabled"}}


def _conversation(body: Any) -> tuple[dict[str, Any], tuple[images.ImageInput, ...]]:
    """The part of the engine body a count-tokens call shares (messages, tools, template switches), and the
    images its messages hold."""
    if not isinstance(body, dict):
        raise ValidationError("request body must be a JSON object")
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise _fail("required, a non-empty string", "model")
    found: images.Found = []
    engine: dict[str, Any] = {"messages": _messages(body, found)}
    if tools := _tools(body.get("tools")):
        engine["tools"] = tools
        if body.get("tool_choice") is not None:
            engine["tool_choice"], parallel = _tool_choice(body["tool_choice"])
            if not parallel:
                engine["parallel_tool_calls"] = False
    if engine["messages"][-1]["role"] == "assistant":
        engine.update(add_generation_prompt=False, continue_final_message=True)
    engine.update(_thinking(body.get("thinking")))
    return engine, images.placed(engine["messages"], found)


def normalize(body: Any, context: RequestContext | None = None) -> ClientRequest:
    engine_body, found = _conversation(body)
    engine_body["max_tokens"] = min(_positive_int(body.get("max_tokens"), "max_tokens"), MAX_TOKENS)
    stops = body.get("stop_sequences")
    if stops is not None and (not isinstance(stops, list) or not all(isinstance(s, str) for s in stops)):
        raise _fail("must be an array of strings", "stop_sequences")
    if stops:
        engine_body["stop"] = list(stops)
    for name in ("temperature", "top_p", "top_k"):
        if (value := _number(body, name)) is not None:
            engine_body[name] = value
    if not isinstance(body.get("stream", False), bool):
        raise _fail("must be a boolean", "stream")
    options = {"stop": stops or [], "images": found}
    return ClientRequest(PROVIDER, engine_body, bool(body.get("stream")), body["model"], options)


# --- response ------------------------------------------------------------------------------------------------


def signature(thinking: str) -> str:
    """An opaque, deterministic signature for a thinking block (clients only echo it back)."""
    return "polar-" + hashlib.sha256(thinking.encode()).hexdigest()[:32]


def content_blocks(answer: EngineAnswer) -> list[dict[str, Any]]:
    """The answer as content blocks: thinking, then text (unless only whitespace), then tool_use."""
    blocks: list[dict[str, Any]] = []
    # vLLM leaves the newlines around the reasoning and the "\n\n" after </think>; the chat template drops both
    # again when the turn comes back as history, so trimming them here keeps the prompt prefix intact.
    reasoning, text = (answer.reasoning or "").strip("\n"), answer.content
    if reasoning:
        blocks.append({"type": "thinking", "thinking": reasoning, "signature": signature(reasoning)})
        text = text.lstrip("\n")
    if text.strip():
        blocks.append({"type": "text", "text": text})
    for call in answer.tool_calls:
        function = call.get("function") or {}
        arguments = parse_arguments(function.get("arguments", ""))
        tool_input = arguments if isinstance(arguments, dict) else function.get("arguments")
        blocks.append(
            {"type": "tool_use", "id": client_tool_id(str(call.get("id"))), "name": function.get("name"),
             "input": tool_input}
        )  # fmt: skip
    return blocks


def stop_reason(request: ClientRequest, answer: EngineAnswer) -> tuple[str, str | None]:
    """Anthropic's ``stop_reason`` and ``stop_sequence`` for the engine's finish (protocols.md §6)."""
    finish = answer.finish_reason
    if finish == "length":
        return "max_tokens", None
    if answer.tool_calls:
        return "tool_use", None
    if finish == "content_filter":
        return "refusal", None
    matched = answer.stop_reason
    if isinstance(matched, str) and matched in request.options.get("stop", ()):
        return "stop_sequence", matched
    return "end_turn", None


def usage(answer: EngineAnswer) -> dict[str, int]:
    counts = answer.usage
    return {
        "input_tokens": counts["prompt_tokens"] - counts["cached_tokens"],
        "output_tokens": counts["completion_tokens"],
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": counts["cached_tokens"],
    }


def message_id(answer: EngineAnswer) -> str:
    engine_id = str(answer.body.get("id") or uuid.uuid4().hex)
    return "msg_" + engine_id.removeprefix("chatcmpl-")


def render_response(request: ClientRequest, answer: EngineAnswer) -> dict[str, Any]:
    reason, sequence = stop_reason(request, answer)
    return {
        "id": message_id(answer),
        "type": "message",
        "role": "assistant",
        "model": request.model or answer.body.get("model"),
        "content": content_blocks(answer),
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": usage(answer),
    }


def render_stream(request: ClientRequest, answer: EngineAnswer) -> Iterator[bytes]:
    raw_arguments = [(call.get("function") or {}).get("arguments") for call in answer.tool_calls]
    return anthropic_stream.events(render_response(request, answer), raw_arguments)


# --- errors, models, count_tokens ----------------------------------------------------------------------------

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    502: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def _error(status: int, message: str) -> dict[str, Any]:
    kind = _ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def render_error(status: int, message: str) -> dict[str, Any]:
    return {**_error(status, message), "request_id": "req_" + uuid.uuid4().hex}


def render_stream_error(status: int, message: str) -> bytes:
    """The SDK raises on an ``event: error``, with the error's type from the data."""
    return anthropic_stream.event("error", error=_error(status, message)["error"])


def count_tokens_request(body: Any, context: RequestContext | None = None) -> dict[str, Any]:
    engine, _ = _conversation(body)
    keys = ("messages", "tools", "add_generation_prompt", "continue_final_message", "chat_template_kwargs")
    return {"add_generation_prompt": True, **{key: engine[key] for key in keys if key in engine}}


def render_count_tokens(count: int) -> dict[str, Any]:
    return {"input_tokens": count}


def render_models(model_ids: list[str]) -> dict[str, Any]:
    data = [{"type": "model", "id": m, "display_name": m, "created_at": "1970-01-01T00:00:00Z"} for m in model_ids]
    return {
        "data": data,
        "has_more": False,
        "first_id": model_ids[0] if model_ids else None,
        "last_id": model_ids[-1] if model_ids else None,
    }
