"""OpenAI Chat Completions (``/v1/chat/completions``): the shape the engine itself speaks, so normalising is
mostly validation and rendering is mostly removing the capture fields the client did not ask for."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from polar.errors import ValidationError
from polar.protocols import images
from polar.protocols._base import ClientRequest, EngineAnswer, RequestContext, name_in, route, sse

PROVIDER = "openai_chat"
ROUTES = (
    route("POST", r"/v1/chat/completions", "generate"),
    route("POST", r"/chat/completions", "generate"),
    route("GET", r"/v1/models", "models"),
)

# Request fields forwarded to the engine; anything else a client sends is dropped rather than rejected, as
# clients send vendor extras (``store``, ``metadata``, ``user``) the engine would refuse.
FORWARDED = (
    "messages",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "stop",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "response_format",
    "logprobs",
    "top_logprobs",
    "chat_template_kwargs",
    "add_generation_prompt",
    "continue_final_message",
)
ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
MAX_OUTPUT_TOKENS = 32768
TOOL_CHOICES = frozenset({"none", "auto", "required"})
CAPTURE_FIELDS = ("prompt_token_ids", "prompt_logprobs", "kv_transfer_params")
CHOICE_CAPTURE_FIELDS = ("token_ids", "stop_reason", "routed_experts")


def _check_content(content: Any, field: str, role: str) -> None:
    if content is None or isinstance(content, str):
        return
    if not isinstance(content, list):
        raise ValidationError(f"{field}: must be a string or an array of content parts", field=field)
    for index, part in enumerate(content):
        kind = name_in(part.get("type")) if isinstance(part, dict) else None
        if kind in {"text", "refusal"} and isinstance(part.get("text", part.get("refusal")), str):
            continue
        if kind == "image_url" and role == "user":
            continue  # read (and checked) by _with_images
        if kind == "image_url":
            where = f"{field}[{index}]"
            raise ValidationError(f"{where}: image_url parts are only accepted in user messages", field=where)
        if kind in {"input_audio", "file"}:
            raise ValidationError(f"{field}[{index}]: {kind} input is not supported by this model", field=field)
        raise ValidationError(f"{field}[{index}]: must be a text content part", field=f"{field}[{index}]")


def _check_types(body: dict[str, Any]) -> None:
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise ValidationError("model: required, a non-empty string", field="model")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ValidationError("messages: required, a non-empty array", field="messages")
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise ValidationError(f"messages[{index}]: must be an object", field=f"messages[{index}]")
        if name_in(message.get("role")) not in ROLES:
            raise ValidationError(
                f"messages[{index}].role: must be one of {', '.join(sorted(ROLES))}", field=f"messages[{index}].role"
            )
        _check_content(message.get("content"), f"messages[{index}].content", message["role"])
    for name, kind in (("stream", bool), ("tools", list), ("stop", (str, list)), ("stream_options", dict)):
        if name in body and body[name] is not None and not isinstance(body[name], kind):
            raise ValidationError(f"{name}: wrong type", field=name)
    for name in ("max_tokens", "max_completion_tokens", "n"):
        value = body.get(name)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ValidationError(f"{name}: must be a positive integer", field=name)
    choice = body.get("tool_choice")
    named = isinstance(choice, dict) and isinstance(choice.get("function"), dict)
    if (
        choice is not None
        and not (isinstance(choice, str) and choice in TOOL_CHOICES)  # a list or dict is no member (nor hashable)
        and not (named and isinstance(choice["function"].get("name"), str))
    ):
        raise ValidationError("tool_choice: none, auto, required or {type: function, function: {name}}", "tool_choice")
    if body.get("n", 1) != 1:
        raise ValidationError("n: only n=1 is supported (each sample is its own session)", field="n")
    if body.get("stream_options") and not body.get("stream"):
        raise ValidationError("stream_options: only allowed when stream is true", field="stream_options")


def _current_reasoning_name(message: dict[str, Any]) -> dict[str, Any]:
    """An assistant message's ``reasoning_content`` (the name vLLM used before 0.1x, which clients still echo from
    streamed deltas) as ``reasoning``: vLLM 0.32's chat completions read both, but its ``/tokenize`` drops
    ``reasoning_content``, so a prompt Polar tokenises (TITO, count-tokens, audits) would lose the reasoning the
    engine rendered. A new dict; the client's stays as it came."""
    if "reasoning_content" not in message or message.get("role") != "assistant":
        return message
    renamed = {k: v for k, v in message.items() if k != "reasoning_content"}
    if renamed.get("reasoning") is None:
        renamed["reasoning"] = message["reasoning_content"]
    return renamed


def _image(part: dict[str, Any], where: str, found: images.Found) -> dict[str, Any]:
    """An ``image_url`` part as the engine takes it: ``image_url`` a string or ``{url, detail}``, a data URL's
    media type the bytes' own, ``detail`` only when vLLM knows it."""
    raw = part.get("image_url")
    if isinstance(raw, str):
        chat, image = images.from_url(raw, f"{where}.image_url", "user")
    elif isinstance(raw, dict):
        chat, image = images.from_url(raw.get("url"), f"{where}.image_url.url", "user", raw.get("detail"))
    else:
        raise ValidationError(f"{where}.image_url: required, {{url, detail?}}", field=f"{where}.image_url")
    found.append((chat, image))
    return chat


def _with_images(message: dict[str, Any], index: int, found: images.Found) -> dict[str, Any]:
    """``message`` with its image parts normalised (a new dict); a message without any stays the client's."""
    content = message.get("content")
    if not isinstance(content, list) or not any(part.get("type") == "image_url" for part in content):
        return message
    where = f"messages[{index}].content"
    parts = [_image(part, f"{where}[{at}]", found) if part.get("type") == "image_url" else part
             for at, part in enumerate(content)]  # fmt: skip
    return {**message, "content": parts}


def normalize(body: Any, context: RequestContext | None = None) -> ClientRequest:
    if not isinstance(body, dict):
        raise ValidationError("request body must be a JSON object")
    _check_types(body)
    # No copies: nothing downstream mutates the client's objects (the proxy builds new dicts around them).
    engine_body = {name: body[name] for name in FORWARDED if name in body and body[name] is not None}
    found: images.Found = []
    engine_body["messages"] = [
        _with_images(_current_reasoning_name(message), index, found) for index, message in enumerate(body["messages"])
    ]
    for name in ("max_tokens", "max_completion_tokens"):
        if name in engine_body:
            engine_body[name] = min(engine_body[name], MAX_OUTPUT_TOKENS)
    stream = bool(body.get("stream"))
    options = {
        "include_usage": bool((body.get("stream_options") or {}).get("include_usage")),
        "logprobs": bool(body.get("logprobs")),
        "return_token_ids": bool(body.get("return_token_ids")),
        "images": images.placed(engine_body["messages"], found),
    }
    return ClientRequest(PROVIDER, engine_body, stream, body["model"], options)


def render_response(request: ClientRequest, answer: EngineAnswer) -> dict[str, Any]:
    """The engine's answer with the client's model name and without the capture fields it did not ask for
    (new outer dicts only: the stored engine answer stays as it came)."""
    keep_ids = request.options.get("return_token_ids")
    body = {k: v for k, v in answer.body.items() if keep_ids or k not in CAPTURE_FIELDS}
    body["model"] = request.model or body.get("model")
    choices = []
    for choice in body.get("choices", []):
        choice = {k: v for k, v in choice.items() if keep_ids or k not in CHOICE_CAPTURE_FIELDS}
        if not request.options.get("logprobs"):
            choice["logprobs"] = None
        choices.append(choice)
    body["choices"] = choices
    return body


def _chunk(base: dict[str, Any], delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
    choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish, **extra}
    return sse({**base, "choices": [choice]})


def render_stream(request: ClientRequest, answer: EngineAnswer) -> Iterator[bytes]:
    full = render_response(request, answer)
    base = {
        "id": full.get("id", "chatcmpl-polar"),
        "object": "chat.completion.chunk",
        "created": full.get("created", int(time.time())),
        "model": full["model"],
    }
    if request.options.get("include_usage"):
        base["usage"] = None
    choice = full["choices"][0]
    message = choice.get("message") or {}
    yield _chunk(base, {"role": "assistant", "content": ""})
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if reasoning:
        yield _chunk(base, {"reasoning_content": reasoning})
    if message.get("content"):
        yield _chunk(base, {"content": message["content"]})
    for index, call in enumerate(message.get("tool_calls") or []):
        function = call.get("function") or {}
        head = {"index": index, "id": call.get("id"), "type": "function"}
        yield _chunk(base, {"tool_calls": [{**head, "function": {"name": function.get("name"), "arguments": ""}}]})
        yield _chunk(base, {"tool_calls": [{"index": index, "function": {"arguments": function.get("arguments", "")}}]})
    extra = {"logprobs": choice.get("logprobs")} if request.options.get("logprobs") else {}
    yield _chunk(base, {}, choice.get("finish_reason"), **extra)
    if request.options.get("include_usage"):
        yield sse({**base, "choices": [], "usage": full.get("usage")})
    yield sse("[DONE]")


_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    404: "invalid_request_error",
    409: "invalid_request_error",
    413: "invalid_request_error",
    429: "requests",  # OpenAI: the kind of limit hit ("requests" | "tokens"), code "rate_limit_exceeded"
}
_ERROR_CODES = {401: "invalid_api_key", 429: "rate_limit_exceeded", 504: "timeout"}


def render_error(status: int, message: str) -> dict[str, Any]:
    return {
        "error": {
            "message": message,
            "type": _ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error"),
            "param": None,
            "code": _ERROR_CODES.get(status),
        }
    }


def render_stream_error(status: int, message: str) -> bytes:
    """The SDK raises on any ``data:`` line carrying an ``error`` key."""
    return sse(render_error(status, message))


def count_tokens_request(body: Any, context: RequestContext | None = None) -> dict[str, Any]:
    request = normalize(body, context)
    return {key: request.engine_body[key] for key in ("messages", "tools") if key in request.engine_body}


def render_count_tokens(count: int) -> dict[str, Any]:
    return {"input_tokens": count}


def render_models(model_ids: list[str]) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [{"id": m, "object": "model", "created": 0, "owned_by": "polar"} for m in model_ids],
    }
