"""OpenAI Responses (``/v1/responses``, Codex's wire API): input items become chat messages for the engine and
the engine's answer becomes output items (``reasoning``, ``message``, ``function_call``, ``custom_tool_call``).

The proxy is stateless, so clients send the full history each turn (``store: false``, as Codex does);
``previous_response_id`` is refused. Custom (free-form) tools are offered to the engine as functions taking one
string ``input`` and rendered back as ``custom_tool_call`` items; namespaced tools are flattened and their calls
carry the namespace again. Hosted tools Codex may offer (``web_search``, …) cannot be served and are dropped.
The event stream lives in ``openai_responses_stream``.
"""

from __future__ import annotations

import copy
import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

from polar.errors import ValidationError
from polar.protocols import images, openai_chat
from polar.protocols._base import ClientRequest, EngineAnswer, RequestContext, name_in, parse_arguments, route
from polar.protocols.openai_responses_stream import failed_events, stream_events

PROVIDER = "openai_responses"
ROUTES = (
    route("POST", r"/v1/responses", "generate"),
    route("POST", r"/responses", "generate"),
    route("POST", r"/v1/responses/input_tokens", "count_tokens"),
    route("POST", r"/responses/input_tokens", "count_tokens"),
)

MAX_OUTPUT_TOKENS = 32768
# Hosted tools Codex offers depending on model and features; no engine can run them, so they are left out.
DROPPED_TOOLS = frozenset({"web_search", "web_search_preview", "local_shell", "image_generation", "tool_search"})
CUSTOM_PARAMETERS = {"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"]}
UNSUPPORTED_PARTS = frozenset({"input_file", "input_audio"})
TEXT_PARTS = frozenset({"input_text", "output_text", "text", "refusal", "summary_text", "reasoning_text"})
SYSTEM_ROLES = frozenset({"system", "developer"})
ROLES = frozenset({"user", "assistant", *SYSTEM_ROLES})
THINKING_OFF = frozenset({"none", "minimal"})
# Echoed back on the response object as the client sent them.
ECHOED = ("instructions", "max_output_tokens", "metadata", "prompt_cache_key", "reasoning", "service_tier",
          "store", "temperature", "text", "top_p", "truncation", "user")  # fmt: skip


def _fail(message: str, field: str | None = None) -> ValidationError:
    return ValidationError(message, field=field)


def _check_types(body: dict[str, Any]) -> None:
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise _fail("model: required, a non-empty string", "model")
    if body.get("previous_response_id") is not None or body.get("conversation") is not None:
        raise _fail(
            "previous_response_id / conversation: not supported; this proxy stores nothing, so send the full "
            "history in input (store: false)",
            "previous_response_id",
        )
    if not isinstance(body.get("input"), (str, list)) or not body["input"]:
        raise _fail("input: required, a non-empty string or array of items", "input")
    kinds = (("stream", bool), ("tools", list), ("instructions", str), ("reasoning", dict), ("text", dict),
             ("parallel_tool_calls", bool), ("tool_choice", (str, dict)))  # fmt: skip
    for name, kind in kinds:
        if body.get(name) is not None and not isinstance(body[name], kind):
            raise _fail(f"{name}: wrong type", name)
    for parent, name, kind in (("reasoning", "effort", str), ("text", "format", dict)):
        value = (body.get(parent) or {}).get(name)
        if value is not None and not isinstance(value, kind):
            raise _fail(f"{parent}.{name}: must be {'a string' if kind is str else 'an object'}", f"{parent}.{name}")
    for name in ("temperature", "top_p"):
        value = body.get(name)
        if value is not None and (not isinstance(value, (int, float)) or isinstance(value, bool)):
            raise _fail(f"{name}: must be a number", name)
    value = body.get("max_output_tokens")
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise _fail("max_output_tokens: must be a positive integer", "max_output_tokens")


def _image(part: dict[str, Any], where: str, found: images.Found, source: str) -> dict[str, Any]:
    if part.get("file_id") is not None:
        raise _fail(
            f"{where}.file_id: uploaded files are not supported (this proxy has no file store); send the image "
            "in image_url as a data URL",
            f"{where}.file_id",
        )
    chat, image = images.from_url(part.get("image_url"), f"{where}.image_url", source, part.get("detail"))
    found.append((chat, image))
    return chat


def _pieces(content: Any, where: str, found: images.Found | None, source: str = "user") -> list[str | dict[str, Any]]:
    """The texts and image parts of a string or a list of content parts, in order. Images only where ``found``
    collects them (user messages, tool outputs); files and audio are refused."""
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list):
        raise _fail(f"{where}: must be a string or an array of content parts", where)
    pieces: list[str | dict[str, Any]] = []
    for index, part in enumerate(content):
        kind, at = (name_in(part.get("type")) if isinstance(part, dict) else None), f"{where}[{index}]"
        if kind == "input_image" and found is not None:
            pieces.append(_image(part, at, found, source))
            continue
        if kind == "input_image":
            raise _fail(f"{at}: input_image is only accepted in user messages and tool call outputs", at)
        if kind in UNSUPPORTED_PARTS:
            raise _fail(f"{at}: {kind} is not supported by this model (text and images only)", at)
        if kind not in TEXT_PARTS or not isinstance(part.get("text", part.get("refusal")), str):
            raise _fail(f"{at}: expected a text part, got {kind!r}", at)
        pieces.append(part.get("text", part.get("refusal")))
    return pieces


def _text(content: Any, where: str) -> str:
    """The text of a string or a list of text parts; images are refused here (assistant, system, reasoning)."""
    return "\n".join(piece for piece in _pieces(content, where, None) if isinstance(piece, str))


class _Tools:
    """Client tools as engine functions, with the map back from engine names to client names and kinds."""

    def __init__(self, tools: list[Any]) -> None:
        self.engine: list[dict[str, Any]] = []
        self.by_engine: dict[str, dict[str, Any]] = {}
        for index, tool in enumerate(tools):
            if not isinstance(tool, dict):
                raise _fail(f"tools[{index}]: must be an object", f"tools[{index}]")
            if tool.get("type") == "namespace":
                inners = tool.get("tools") or []
                if not isinstance(inners, list) or not all(isinstance(inner, dict) for inner in inners):
                    raise _fail(f"tools[{index}].tools: must be an array of tools", f"tools[{index}].tools")
                for inner in inners:
                    self._add(inner, f"tools[{index}]", tool.get("name"))
            elif name_in(tool.get("type")) not in DROPPED_TOOLS:
                self._add(tool, f"tools[{index}]", None)

    def _add(self, tool: dict[str, Any], where: str, namespace: str | None) -> None:
        kind, name = tool.get("type"), tool.get("name")
        if kind not in ("function", "custom"):
            raise _fail(f"{where}: tool type {kind!r} is not supported (function and custom tools only)", where)
        if not isinstance(name, str) or not name:
            raise _fail(f"{where}.name: required, a non-empty string", f"{where}.name")
        engine_name = name if name not in self.by_engine or namespace is None else f"{namespace}.{name}"
        if engine_name in self.by_engine:
            raise _fail(f"{where}.name: a tool named {name!r} is already defined", f"{where}.name")
        parameters = tool.get("parameters") if kind == "function" else CUSTOM_PARAMETERS
        function = {"name": engine_name, "description": tool.get("description") or "",
                    "parameters": parameters or {"type": "object", "properties": {}}}  # fmt: skip
        self.engine.append({"type": "function", "function": function})
        self.by_engine[engine_name] = {"kind": kind, "name": name, "namespace": namespace}

    def engine_name(self, name: Any, namespace: Any = None) -> str:
        for engine_name, known in self.by_engine.items():
            if known["name"] == name and known["namespace"] == namespace:
                return engine_name
        return str(name)

    def choice(self, choice: Any) -> Any:
        if choice is None or choice in ("auto", "none", "required"):
            return choice
        if isinstance(choice, dict) and choice.get("type") in ("function", "custom"):
            return {"type": "function", "function": {"name": self.engine_name(choice.get("name"))}}
        if isinstance(choice, dict) and choice.get("type") == "allowed_tools":
            return "required" if choice.get("mode") == "required" else "auto"
        raise _fail(f"tool_choice: {choice!r} is not supported", "tool_choice")


class _Messages:
    """Builds the chat messages: reasoning, text and calls of one assistant turn merge into one message."""

    def __init__(self, tools: _Tools) -> None:
        self.tools = tools
        self.messages: list[dict[str, Any]] = []
        self.turn: dict[str, Any] | None = None
        self.found: images.Found = []
        # Tool-output images wait for the end of their turn's tool messages (which must stay together after the
        # assistant's calls), then become one user message.
        self.moved: list[dict[str, Any]] = []

    def _place_moved(self) -> None:
        if self.moved:
            self.messages.append({"role": "user", "content": self.moved})
            self.moved = []

    def flush(self) -> None:
        if self.turn is not None:
            self.messages.append(self.turn)
            self.turn = None

    def assistant(self, *, reasoning: str | None = None, content: str | None = None, call: Any = None) -> None:
        turn = self.turn
        if turn is not None and (
            (reasoning is not None and ("content" in turn or "tool_calls" in turn or "reasoning" in turn))
            or (content is not None and ("content" in turn or "tool_calls" in turn))
        ):
            self.flush()
        if self.turn is None:
            self._place_moved()
        self.turn = turn = self.turn or {"role": "assistant"}
        if reasoning is not None:
            turn["reasoning"] = reasoning
        if content is not None:
            turn["content"] = content
        if call is not None:
            turn.setdefault("tool_calls", []).append(call)

    def other(self, message: dict[str, Any], moved: list[dict[str, Any]] | None = None) -> None:
        self.flush()
        if message["role"] != "tool":
            self._place_moved()
        self.moved += moved or []
        last = self.messages[-1] if self.messages else None
        if message["role"] == "system" and last is not None and last["role"] == "system":
            last["content"] += "\n\n" + message["content"]  # consecutive system texts merge, in order
        else:
            self.messages.append(message)

    def done(self) -> list[dict[str, Any]]:
        self.flush()
        self._place_moved()
        for message in self.messages:
            if message["role"] == "assistant":
                message.setdefault("content", "")
        return self.messages


def _call(item: dict[str, Any], where: str, tools: _Tools, custom: bool) -> dict[str, Any]:
    call_id, name = item.get("call_id"), item.get("name")
    if not isinstance(call_id, str) or not call_id or not isinstance(name, str) or not name:
        raise _fail(f"{where}: call_id and name are required strings", where)
    field = "input" if custom else "arguments"
    if not isinstance(item.get(field), str):
        raise _fail(f"{where}.{field}: required, a string", f"{where}.{field}")
    arguments = json.dumps({"input": item["input"]}, ensure_ascii=False) if custom else item["arguments"]
    engine_name = tools.engine_name(name, item.get("namespace"))
    return {"id": call_id, "type": "function", "function": {"name": engine_name, "arguments": arguments}}


def _reasoning_text(item: dict[str, Any], where: str) -> str:
    """Full reasoning from ``content``; else the summary, which carries the full text when we wrote it."""
    if item.get("content"):
        return _text(item["content"], f"{where}.content")
    summary = item.get("summary") or []
    texts = [part.get("text", "") for part in summary if isinstance(part, dict)] if isinstance(summary, list) else None
    if texts is None or not all(isinstance(text, str) for text in texts):
        raise _fail(f"{where}.summary: must be an array of summary_text parts", f"{where}.summary")
    return "\n\n".join(texts)


def _add_item(out: _Messages, item: Any, where: str) -> None:
    if not isinstance(item, dict):
        raise _fail(f"{where}: must be an object", where)
    kind = item.get("type", "message" if "role" in item else None)
    if kind == "message":
        role = name_in(item.get("role"))
        if role not in ROLES:
            raise _fail(f"{where}.role: must be one of {', '.join(sorted(ROLES))}", f"{where}.role")
        if role == "user":
            pieces = _pieces(item.get("content"), f"{where}.content", out.found)
            out.other({"role": "user", "content": images.content(pieces)})
        elif role == "assistant":
            out.assistant(content=_text(item.get("content"), f"{where}.content"))
        else:
            out.other({"role": "system", "content": _text(item.get("content"), f"{where}.content")})
    elif kind == "reasoning":
        if text := _reasoning_text(item, where):  # an opaque (encrypted-only) reasoning item adds nothing
            out.assistant(reasoning=text)
    elif kind in ("function_call", "custom_tool_call"):
        out.assistant(call=_call(item, where, out.tools, custom=kind == "custom_tool_call"))
    elif kind in ("function_call_output", "custom_tool_call_output"):
        if not isinstance(item.get("call_id"), str) or "output" not in item:
            raise _fail(f"{where}: call_id and output are required", where)
        pieces = _pieces(item["output"], f"{where}.output", out.found, "tool_result")
        texts = [piece for piece in pieces if isinstance(piece, str)]
        moved = [piece for piece in pieces if not isinstance(piece, str)]
        out.other({"role": "tool", "tool_call_id": item["call_id"], "content": "\n".join(texts)}, moved)
    else:
        raise _fail(f"{where}: input item type {kind!r} is not supported", where)


def _thinking(reasoning: dict[str, Any] | None) -> dict[str, Any] | None:
    if reasoning and reasoning.get("effort") in THINKING_OFF:
        return {"enable_thinking": False}
    return None


def _response_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    fmt = (text or {}).get("format") or {}
    if fmt.get("type") == "json_schema":
        schema = {key: fmt[key] for key in ("name", "schema", "strict", "description") if key in fmt}
        return {"type": "json_schema", "json_schema": schema}
    return {"type": "json_object"} if fmt.get("type") == "json_object" else None


def normalize(body: Any, context: RequestContext | None = None) -> ClientRequest:
    if not isinstance(body, dict):
        raise _fail("request body must be a JSON object")
    _check_types(body)
    tools = _Tools(body.get("tools") or [])
    out = _Messages(tools)
    if body.get("instructions"):
        out.other({"role": "system", "content": body["instructions"]})
    items = [{"role": "user", "content": body["input"]}] if isinstance(body["input"], str) else body["input"]
    for index, item in enumerate(items):
        _add_item(out, item, f"input[{index}]")
    engine_body: dict[str, Any] = {"messages": out.done()}
    found = images.placed(engine_body["messages"], out.found)
    if tools.engine:
        engine_body["tools"] = tools.engine
        if body.get("tool_choice") is not None:
            engine_body["tool_choice"] = tools.choice(body["tool_choice"])
        if body.get("parallel_tool_calls") is not None:
            engine_body["parallel_tool_calls"] = body["parallel_tool_calls"]
    if body.get("max_output_tokens") is not None:
        engine_body["max_tokens"] = min(body["max_output_tokens"], MAX_OUTPUT_TOKENS)
    for name in ("temperature", "top_p"):
        if body.get(name) is not None:
            engine_body[name] = body[name]
    if (kwargs := _thinking(body.get("reasoning"))) is not None:
        engine_body["chat_template_kwargs"] = kwargs
    if (response_format := _response_format(body.get("text"))) is not None:
        engine_body["response_format"] = response_format
    echo = {name: copy.deepcopy(body[name]) for name in ECHOED if name in body}
    echo["tools"] = copy.deepcopy(body.get("tools") or [])
    echo["tool_choice"] = copy.deepcopy(body.get("tool_choice") or "auto")
    echo["parallel_tool_calls"] = body.get("parallel_tool_calls", True)
    options = {"tools": tools.by_engine, "echo": echo, "images": found}
    return ClientRequest(PROVIDER, engine_body, bool(body.get("stream")), body["model"], options)


def _ids(answer: EngineAnswer) -> str:
    engine_id = str(answer.body.get("id") or "")
    return engine_id.removeprefix("chatcmpl-").replace("-", "") or uuid.uuid4().hex


def _tool_item(request: ClientRequest, call: dict[str, Any], base: str, index: int) -> dict[str, Any]:
    function = call.get("function") or {}
    name, arguments = function.get("name") or "", function.get("arguments") or ""
    known = request.options.get("tools", {}).get(name) or {"kind": "function", "name": name, "namespace": None}
    item: dict[str, Any] = {"call_id": call.get("id") or f"call_{base}_{index}", "name": known["name"]}
    if known["namespace"] is not None:
        item["namespace"] = known["namespace"]
    if known["kind"] == "custom":
        parsed = parse_arguments(arguments)
        text = parsed.get("input") if isinstance(parsed, dict) else None
        text = text if isinstance(text, str) else arguments if isinstance(arguments, str) else json.dumps(parsed)
        return {"id": f"ctc_{base}_{index}", "type": "custom_tool_call", **item, "input": text}
    return {"id": f"fc_{base}_{index}", "type": "function_call", **item, "arguments": arguments, "status": "completed"}


def output_items(request: ClientRequest, answer: EngineAnswer) -> list[dict[str, Any]]:
    """The answer as Responses output items; text that is only whitespace is left out."""
    base, items = _ids(answer), []
    # Newlines around reasoning and before text after a think block: chat templates (Qwen3's, the engine's) drop
    # them again when the turn comes back as history, so the cleaned text still renders to the same tokens.
    if answer.reasoning and answer.reasoning.strip():
        reasoning = answer.reasoning.strip("\n")
        summary = [{"type": "summary_text", "text": reasoning}]
        content = [{"type": "reasoning_text", "text": reasoning}]
        items.append({"id": f"rs_{base}", "type": "reasoning", "summary": summary, "content": content})
    if answer.content.strip():
        text = answer.content.lstrip("\n") if items else answer.content
        part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
        items.append({"id": f"msg_{base}", "type": "message", "role": "assistant", "status": "completed",
                      "content": [part]})  # fmt: skip
    items.extend(_tool_item(request, call, base, index) for index, call in enumerate(answer.tool_calls))
    return items


def _usage(answer: EngineAnswer) -> dict[str, Any]:
    usage = answer.usage
    details = (answer.body.get("usage") or {}).get("completion_tokens_details") or {}
    return {
        "input_tokens": usage["prompt_tokens"],
        "input_tokens_details": {"cached_tokens": usage["cached_tokens"], "cache_write_tokens": 0},
        "output_tokens": usage["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": int(details.get("reasoning_tokens") or 0)},
        "total_tokens": usage["total_tokens"],
    }


def render_response(request: ClientRequest, answer: EngineAnswer) -> dict[str, Any]:
    incomplete = answer.finish_reason == "length"
    created = int(answer.body.get("created") or time.time())
    return {
        "id": f"resp_{_ids(answer)}",
        "object": "response",
        "created_at": created,
        "completed_at": created,
        "status": "incomplete" if incomplete else "completed",
        "background": False,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "model": request.model,
        "output": output_items(request, answer),
        "previous_response_id": None,
        "usage": _usage(answer),
        "instructions": None,
        "metadata": {},
        "temperature": None,
        "top_p": None,
        "truncation": "disabled",
        **copy.deepcopy(dict(request.options.get("echo", {}))),
    }


def render_stream(request: ClientRequest, answer: EngineAnswer) -> Iterator[bytes]:
    return stream_events(render_response(request, answer))


def render_error(status: int, message: str) -> dict[str, Any]:
    return openai_chat.render_error(status, message)


def render_stream_error(status: int, message: str) -> bytes:
    """An ``error`` event (the SDK raises on its ``error`` key), then ``response.failed`` (what Codex reads)."""
    return failed_events(render_error(status, message)["error"])


def count_tokens_request(body: Any, context: RequestContext | None = None) -> dict[str, Any]:
    """``/v1/responses/input_tokens``: the same items as a generate call (``model`` may be left out there)."""
    if isinstance(body, dict) and not body.get("model"):
        body = {**body, "model": "count"}
    request = normalize(body, context)
    return {key: request.engine_body[key] for key in ("messages", "tools") if key in request.engine_body}


def render_count_tokens(count: int) -> dict[str, Any]:
    return {"object": "response.input_tokens", "input_tokens": count}


def render_models(model_ids: list[str]) -> dict[str, Any]:
    return openai_chat.render_models(model_ids)
