"""What every protocol module shares. Each module (``openai_chat``, ``openai_responses``, ``anthropic``,
``gemini``) exposes the same names:

    PROVIDER: str
    ROUTES: tuple[Route, ...]                       paths below the session base URL it serves
    normalize(body, context) -> ClientRequest       the request as the OpenAI chat body the engine takes
    render_response(request, answer) -> dict        the engine's answer in the protocol's response shape
    render_stream(request, answer) -> Iterator[bytes]   the same answer as the protocol's event stream
    render_stream_error(status, message) -> bytes   an error event for a stream that already started
    render_error(status, message) -> dict           an error body in the protocol's own shape
    render_models(model_ids) -> dict                the protocol's model list
    count_tokens_request(body, context) -> dict     the engine ``/tokenize`` body for a count-tokens call
    render_count_tokens(count) -> dict              the protocol's count-tokens answer

Everything here is pure: dicts in, dicts or bytes out. Invalid requests raise ``polar.errors.ValidationError``.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

Operation = Literal["generate", "count_tokens", "models", "head"]


@dataclass(frozen=True)
class Route:
    """``method`` + a full-match ``pattern`` on the path (below ``/s/<key>``), with named groups as params."""

    method: str
    pattern: re.Pattern[str]
    operation: Operation
    stream: bool | None = None  # a path that itself says "stream" (Gemini's :streamGenerateContent)


def route(method: str, pattern: str, operation: Operation, stream: bool | None = None) -> Route:
    return Route(method, re.compile(pattern), operation, stream)


@dataclass(frozen=True)
class RequestContext:
    """What besides the body a protocol may need: path parameters (Gemini's model), query, lower-cased headers."""

    path_params: Mapping[str, str] = field(default_factory=dict)
    query: Mapping[str, str] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)
    stream: bool | None = None


@dataclass(frozen=True)
class ClientRequest:
    """A client's call, normalised: ``engine_body`` is an OpenAI chat request (no capture fields yet).

    ``options`` carries what rendering needs to answer in the client's terms (requested stop sequences, tool
    name or id maps, whether thinking was asked for, …); it is stored with nothing and never sent upstream.
    ``options["stream_media_type"]`` overrides ``text/event-stream`` for a stream that is not SSE.
    """

    provider: str
    engine_body: dict[str, Any]
    stream: bool
    model: str | None
    options: Mapping[str, Any] = field(default_factory=dict)

    @property
    def images(self) -> tuple[Any, ...]:
        """Its images (``polar.protocols.images.ImageInput``, in prompt order); empty without any."""
        return tuple(self.options.get("images") or ())


@dataclass(frozen=True)
class EngineAnswer:
    """The engine's chat completion (vLLM shape, with ``prompt_token_ids`` and per-choice ``token_ids``)."""

    body: dict[str, Any]

    @property
    def choice(self) -> dict[str, Any]:
        return self.body["choices"][0]  # type: ignore[no-any-return]

    @property
    def message(self) -> dict[str, Any]:
        return self.choice.get("message") or {}  # type: ignore[no-any-return]

    @property
    def reasoning(self) -> str | None:
        """vLLM renamed ``reasoning_content`` to ``reasoning``; read both (protocols.md §1.3)."""
        return self.message.get("reasoning") or self.message.get("reasoning_content") or None

    @property
    def content(self) -> str:
        return self.message.get("content") or ""

    @property
    def tool_calls(self) -> list[dict[str, Any]]:
        return list(self.message.get("tool_calls") or [])

    @property
    def prompt_token_ids(self) -> list[int]:
        # Not copied: tens of thousands of ids, read several times a call (callers never change them).
        ids = self.body.get("prompt_token_ids")
        return ids if isinstance(ids, list) else list(ids or [])

    @property
    def completion_token_ids(self) -> list[int]:
        return list(self.choice.get("token_ids") or [])

    @property
    def logprobs(self) -> list[float]:
        content = (self.choice.get("logprobs") or {}).get("content") or []
        return [float(entry["logprob"]) for entry in content]

    @property
    def finish_reason(self) -> str | None:
        return self.choice.get("finish_reason")  # type: ignore[no-any-return]

    @property
    def stop_reason(self) -> int | str | None:
        """The matched stop string (or stop token id) when ``finish_reason`` is ``stop``."""
        return self.choice.get("stop_reason")  # type: ignore[no-any-return]

    @property
    def routed_experts(self) -> bytes | None:
        """vLLM's per-token expert routing (``routed_experts``: base64 of ``.npy`` bytes, shape (prompt + completion
        tokens - 1, layers, experts per token)) as bytes; None when the engine reported none or sent no base64."""
        encoded = self.choice.get("routed_experts")
        if not isinstance(encoded, str) or encoded.startswith(ROUTED_EXPERTS_MOVED):
            return None
        try:
            return base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            return None

    @property
    def usage(self) -> dict[str, int]:
        usage = self.body.get("usage") or {}
        prompt = int(usage.get("prompt_tokens", len(self.prompt_token_ids)))
        completion = int(usage.get("completion_tokens", len(self.completion_token_ids)))
        cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
                "cached_tokens": cached}  # fmt: skip


ROUTED_EXPERTS_MOVED = "stored in model_calls.routed_experts"


def without_routed_experts(body: dict[str, Any]) -> dict[str, Any]:
    """The answer to store: a choice's ``routed_experts`` (base64 that can run to megabytes a call) is kept once, as
    bytes, in ``model_calls.routed_experts``; the stored answer says so in its place. New dicts; ``body`` stays."""
    choices = body.get("choices")
    if not isinstance(choices, list) or not any(isinstance(c, dict) and c.get("routed_experts") for c in choices):
        return body
    moved = [
        {**c, "routed_experts": f"{ROUTED_EXPERTS_MOVED} ({len(c['routed_experts'])} base64 characters)"}
        if isinstance(c, dict) and isinstance(c.get("routed_experts"), str) else c
        for c in choices
    ]  # fmt: skip
    return {**body, "choices": moved}


def continued_answer(engine_body: Mapping[str, Any], answer: EngineAnswer) -> EngineAnswer:
    """The answer to a request that continues a prefilled assistant turn, as the client must read it.

    A reasoning parser that starts every turn inside reasoning (vLLM's ``qwen3`` while thinking is on) reads a
    continuation without ``</think>`` as reasoning, although the prefill it continues was the turn's content
    (``"Paris is"`` → ``" sunny today."``). Such reasoning is content; a prefill that is itself reasoning (an open
    ``<think>``, or reasoning without content) keeps its answer as it is. The stored answer stays as the engine gave
    it: this is only what the client is shown."""
    if not engine_body.get("continue_final_message") or not answer.reasoning or answer.content:
        return answer
    messages = engine_body.get("messages") or [{}]
    prefill = messages[-1].get("content") if isinstance(messages[-1], Mapping) else None
    if isinstance(prefill, list):
        prefill = "".join(p.get("text", "") for p in prefill if isinstance(p, Mapping))
    if not isinstance(prefill, str) or not prefill or prefill.rfind("<think>") > prefill.rfind("</think>"):
        return answer
    message = {k: v for k, v in answer.message.items() if k not in ("reasoning", "reasoning_content")}
    message["content"] = answer.reasoning
    choice = {**answer.choice, "message": message}
    return EngineAnswer({**answer.body, "choices": [choice, *answer.body["choices"][1:]]})


def sse(data: Mapping[str, Any] | str, event: str | None = None) -> bytes:
    """One server-sent event (``event:`` line only when named)."""
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    prefix = f"event: {event}\n" if event else ""
    return f"{prefix}data: {payload}\n\n".encode()


def name_in(value: Any) -> str | None:
    """``value`` when it is a string (a role, a part or tool type, an effort), else None. A client may send a list
    or an object where a name belongs, and those are not hashable: testing one for membership in a set of names
    would raise ``TypeError`` (a 500) instead of the protocol's 400."""
    return value if isinstance(value, str) else None


def parse_arguments(arguments: Any) -> Any:
    """Tool-call arguments as an object: the engine sends a JSON string; keep invalid JSON as a string."""
    if not isinstance(arguments, str):
        return arguments
    try:
        return json.loads(arguments) if arguments.strip() else {}
    except (json.JSONDecodeError, RecursionError):  # nested past the parser's stack: not an object either
        return arguments


def assistant_message(content: str, reasoning: str | None, tool_calls: list[dict[str, Any]]) -> dict[str, Any]:
    """An assistant turn in the engine's (OpenAI chat) shape; reasoning and tool calls only when present."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning:
        message["reasoning"] = reasoning
    if tool_calls:
        message["tool_calls"] = tool_calls
    return message
