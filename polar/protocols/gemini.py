"""Google Gemini ``generateContent`` (gemini-cli, ``google-genai``): ``/v1beta/models/<m>:generateContent``,
``:streamGenerateContent`` (``?alt=sse``; without it a JSON array of the same chunks), ``:countTokens`` and
``GET /v1beta/models``, also under ``/v1``. The model comes from the path and is echoed as ``modelVersion``.

Reading the request lives in ``gemini_request``; this module answers. Thought parts are shown only when
``thinkingConfig.includeThoughts`` is true (as the real API does); the engine's whole answer, reasoning included,
is captured either way. Function calls carry the engine's tool-call ids so a ``functionResponse`` maps straight
back. An answer with nothing to show (no text, no calls) still gets one empty text part and a finish reason.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from polar.errors import ValidationError
from polar.protocols import gemini_request
from polar.protocols._base import ClientRequest, EngineAnswer, RequestContext, parse_arguments, route, sse

PROVIDER = "gemini"


def _routes(version: str) -> tuple[Any, ...]:
    model = rf"/{version}/models/(?P<model>[^/:]+)"
    return (
        route("POST", model + ":generateContent", "generate", stream=False),
        route("POST", model + ":streamGenerateContent", "generate", stream=True),
        route("POST", model + ":countTokens", "count_tokens"),
        route("GET", f"/{version}/models", "models"),
    )


ROUTES = (*_routes("v1beta"), *_routes("v1"))

FINISH_REASONS = {"stop": "STOP", "tool_calls": "STOP", "length": "MAX_TOKENS", "content_filter": "SAFETY"}
THINK_END = "</think>"  # the reasoning parser's end marker (Qwen3 style), used to count thought tokens


def normalize(body: Any, context: RequestContext | None = None) -> ClientRequest:
    context = context or RequestContext()
    engine_body, options = gemini_request.translate(body)
    options["sse"] = context.query.get("alt") == "sse"
    if not options["sse"]:
        options["stream_media_type"] = "application/json"  # without alt=sse the API streams one JSON array
    return ClientRequest(PROVIDER, engine_body, bool(context.stream), context.path_params.get("model"), options)


def _call_parts(answer: EngineAnswer) -> tuple[list[dict[str, Any]], list[str]]:
    """``functionCall`` parts with the engine's ids, and the names of calls whose arguments are no JSON object."""
    parts, malformed = [], []
    for call in answer.tool_calls:
        function = call.get("function") or {}
        args = parse_arguments(function.get("arguments", "{}"))
        if not isinstance(args, dict):
            malformed.append(str(function.get("name")))
            continue
        parts.append({"functionCall": {"id": call.get("id"), "name": function.get("name"), "args": args}})
    return parts, malformed


def _part_groups(request: ClientRequest, answer: EngineAnswer) -> tuple[list[list[dict[str, Any]]], list[str]]:
    """The parts to show, grouped as streamed (thoughts, text, calls), never empty."""
    groups: list[list[dict[str, Any]]] = []
    if request.options.get("include_thoughts") and (answer.reasoning or "").strip():
        # Surrounding newlines are template layout (the template strips them again when the thought comes back).
        groups.append([{"text": (answer.reasoning or "").strip("\n"), "thought": True}])
    if answer.content.strip():
        # After a think block the engine's text starts with blank lines the template drops again in history.
        groups.append([{"text": answer.content.lstrip("\n") if answer.reasoning else answer.content}])
    calls, malformed = _call_parts(answer)
    if calls:
        groups.append(calls)
    return groups or [[{"text": ""}]], malformed


def _thought_tokens(answer: EngineAnswer) -> int | None:
    """How many sampled tokens were reasoning: reported by the engine, or up to its ``</think>`` token."""
    details = (answer.body.get("usage") or {}).get("completion_tokens_details") or {}
    if isinstance(details.get("reasoning_tokens"), int):
        return int(details["reasoning_tokens"])
    if not answer.reasoning:
        return 0
    tokens = [entry.get("token") for entry in ((answer.choice.get("logprobs") or {}).get("content") or [])]
    if THINK_END in tokens:
        return tokens.index(THINK_END) + 1
    if not answer.content.strip() and not answer.tool_calls:  # cut inside the think block: all reasoning
        return answer.usage["completion_tokens"]
    return None


def _usage(answer: EngineAnswer) -> dict[str, int]:
    usage = answer.usage
    thoughts = _thought_tokens(answer)
    metadata = {
        "promptTokenCount": usage["prompt_tokens"],
        "candidatesTokenCount": usage["completion_tokens"] - (thoughts or 0),
        "totalTokenCount": usage["total_tokens"],
    }
    if thoughts is not None:
        metadata["thoughtsTokenCount"] = thoughts
    if usage["cached_tokens"]:
        metadata["cachedContentTokenCount"] = usage["cached_tokens"]
    return metadata


def _candidate(parts: list[dict[str, Any]], finish: dict[str, Any] | None) -> dict[str, Any]:
    return {"content": {"role": "model", "parts": parts}, **(finish or {}), "index": 0}


def _finish(answer: EngineAnswer, malformed: list[str]) -> dict[str, Any]:
    if malformed:
        message = f"Malformed function call: arguments of {', '.join(malformed)} are not a JSON object"
        return {"finishReason": "MALFORMED_FUNCTION_CALL", "finishMessage": message}
    return {"finishReason": FINISH_REASONS.get(answer.finish_reason or "stop", "OTHER")}


def _chunks(request: ClientRequest, answer: EngineAnswer) -> list[dict[str, Any]]:
    """One response per part group; the last carries the finish reason and the usage."""
    groups, malformed = _part_groups(request, answer)
    tail = {"modelVersion": request.model or answer.body.get("model"), "responseId": answer.body.get("id")}
    chunks = [{"candidates": [_candidate(parts, None)], **tail} for parts in groups[:-1]]
    last = {"candidates": [_candidate(groups[-1], _finish(answer, malformed))], "usageMetadata": _usage(answer)}
    return [*chunks, {**last, **tail}]


def render_response(request: ClientRequest, answer: EngineAnswer) -> dict[str, Any]:
    groups, malformed = _part_groups(request, answer)
    return {
        "candidates": [_candidate([part for group in groups for part in group], _finish(answer, malformed))],
        "usageMetadata": _usage(answer),
        "modelVersion": request.model or answer.body.get("model"),
        "responseId": answer.body.get("id"),
    }


def render_stream(request: ClientRequest, answer: EngineAnswer) -> Iterator[bytes]:
    """``data: {json}`` per chunk (no event names, no ``[DONE]``); without ``alt=sse`` a JSON array instead."""
    chunks = _chunks(request, answer)
    if request.options.get("sse", True):
        for chunk in chunks:
            yield sse(chunk)
        return
    for index, chunk in enumerate(chunks):
        yield ("[" if index == 0 else ",\r\n").encode() + json.dumps(chunk, ensure_ascii=False).encode()
    yield b"]"


_STATUSES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ABORTED",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    500: "INTERNAL",
    501: "UNIMPLEMENTED",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


def render_error(status: int, message: str) -> dict[str, Any]:
    kind = _STATUSES.get(status, "INTERNAL" if status >= 500 else "INVALID_ARGUMENT")
    return {"error": {"code": status, "message": message, "status": kind}}


def render_stream_error(status: int, message: str) -> bytes:
    """``@google/genai`` and ``google-genai`` raise on a chunk that is ``{"error": {...}}``."""
    return sse(render_error(status, message))


def count_tokens_request(body: Any, context: RequestContext | None = None) -> dict[str, Any]:
    """``{contents, systemInstruction?, tools?}`` or ``{generateContentRequest: {...}}``, tokenised as the prompt
    a ``generateContent`` with the same input would get (so ``totalTokens`` equals its ``promptTokenCount``)."""
    if isinstance(body, dict) and (inner := gemini_request.field(body, "generateContentRequest")) is not None:
        if not isinstance(inner, dict):
            raise ValidationError("generateContentRequest: must be an object", field="generateContentRequest")
        body = inner
    engine_body, _ = gemini_request.translate(body)
    keys = ("messages", "tools", "add_generation_prompt", "continue_final_message", "chat_template_kwargs")
    return {key: engine_body[key] for key in keys if key in engine_body}


def render_count_tokens(count: int) -> dict[str, Any]:
    return {"totalTokens": count}


def render_models(model_ids: list[str]) -> dict[str, Any]:
    return {
        "models": [
            {
                "name": f"models/{model}",
                "version": "polar",
                "displayName": model,
                "description": f"{model}, served through the Polar proxy",
                "outputTokenLimit": gemini_request.MAX_OUTPUT_TOKENS,
                "supportedGenerationMethods": ["generateContent", "countTokens"],
            }
            for model in model_ids
        ]
    }
