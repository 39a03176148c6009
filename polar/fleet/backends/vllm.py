"""vLLM, through its OpenAI-compatible server: a chat completion with token capture on, or, for a TITO chain, the
exact token prompt through ``/v1/completions`` read back as a chat completion.

A TITO answer's text is parsed with the same reasoning and Hermes tool-call parser vLLM's ``hermes`` + ``qwen3``
parsers use (``polar.chat.completion_parser``), so the protocol modules see an ordinary chat answer. The weight
sync's hold is vLLM's dev-mode ``/pause`` and ``/resume`` (``VLLM_SERVER_DEV_MODE=1``; ``polar.training.engine_sync``).
"""

from __future__ import annotations

import re
import time
import uuid
from typing import Any

import httpx

from polar.chat.completion_parser import chat_message
from polar.contract.engine_addresses import EngineKind
from polar.fleet.backends.base import Asked, EngineMode, EngineRequest, capture_fields
from polar.fleet.engines import EngineReply

KIND: EngineKind = "vllm"
LABEL = "vLLM"
INFO_PATHS = ("/version", "/weight_info")
TOKEN_IN = True
PAUSE_SINCE = (0, 12, 0)  # /pause (PR #28037)
KEEP_SINCE = (0, 16, 0)  # /pause?mode= (PR #32351); an older build ignores mode and aborts

DEFAULT_MAX_TOKENS = 8192
# What a chat request carries that also means something to /v1/completions (vLLM's per-request arguments for
# logits processors, ``vllm_xargs``, included: an operator's POLAR_SAMPLING_OVERRIDES may set them).
_SAMPLING = ("temperature", "top_p", "top_k", "min_p", "seed", "stop", "presence_penalty", "frequency_penalty",
             "repetition_penalty", "min_tokens", "vllm_xargs")  # fmt: skip
_TOO_LONG = re.compile(r"maximum context length is (\d+) tokens and your request has (\d+) input tokens")


def pause_refusal(version: tuple[int, int, int] | None, text: str | None, mode: EngineMode) -> str | None:
    if version is None:
        return None  # a build that does not say: try, and report what it answers
    if version < PAUSE_SINCE:
        return f"vLLM {text} has no /pause (needs ≥ 0.12 with VLLM_SERVER_DEV_MODE=1)"
    if mode == "keep" and version < KEEP_SINCE:
        return f"vLLM {text} cannot keep in-flight requests across a pause (needs ≥ {'.'.join(map(str, KEEP_SINCE))})"
    return None


def pause(client: httpx.Client, url: str, mode: EngineMode, clear_cache: bool) -> httpx.Response:
    return client.post(url + "/pause", params={"mode": mode, "clear_cache": "true" if clear_cache else "false"})


def resume(client: httpx.Client, url: str) -> httpx.Response:
    return client.post(url + "/resume")


def fit_max_tokens(engine_body: dict[str, Any], reply: EngineReply) -> dict[str, Any] | None:
    """The request again with ``max_tokens`` cut to the room the prompt leaves, when the engine refused it only
    for asking more than that (vLLM's 400). Clients such as Claude Code ask 32k-64k regardless of context."""
    match = _TOO_LONG.search(reply.error_message) if reply.status_code == 400 else None
    if match is None:
        return None
    room = int(match.group(1)) - int(match.group(2))
    if room <= 0:
        return None
    fitted = dict(engine_body)
    for name in ("max_tokens", "max_completion_tokens"):
        if name in fitted:
            fitted[name] = min(fitted[name], room)
    return fitted if fitted != engine_body else None


def completion_body(engine_body: dict[str, Any], prompt: list[int]) -> dict[str, Any]:
    """The ``/v1/completions`` request: the token prompt, the chat request's sampling, capture switches on."""
    body = {name: engine_body[name] for name in _SAMPLING if name in engine_body}
    max_tokens = engine_body.get("max_tokens") or engine_body.get("max_completion_tokens") or DEFAULT_MAX_TOKENS
    return {
        **body,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "logprobs": 0,
        "return_token_ids": True,
        "skip_special_tokens": False,
    }


def stored_request(body: dict[str, Any], chain_call_id: uuid.UUID, chat_body: dict[str, Any]) -> dict[str, Any]:
    """What a TITO call stores as its normalised request: exactly the completions ``body`` the engine got,
    annotated (under ``polar_tito``, never sent) with the chat form it stands for."""
    chat = {"chain_call_id": str(chain_call_id), "messages": chat_body.get("messages"), "tools": chat_body.get("tools")}
    return {**body, "polar_tito": chat}


def as_chat_answer(reply: EngineReply, prompt: list[int], tools_offered: bool) -> dict[str, Any]:
    """A ``/v1/completions`` answer as the vLLM chat completion the protocol modules render."""
    body = reply.body
    choice = body["choices"][0]
    message = chat_message(str(choice.get("text") or ""), tools_offered)
    finish = choice.get("finish_reason")
    logprobs = (choice.get("logprobs") or {}).get("token_logprobs") or []
    tokens = (choice.get("logprobs") or {}).get("tokens") or [""] * len(logprobs)
    ids = choice.get("prompt_token_ids") or prompt  # the engine's own reading, kept as read (TokenIds: checked)
    return {
        "id": str(body.get("id") or f"cmpl-{uuid.uuid4().hex}"),  # the engine's own id, as its log has it
        "object": "chat.completion",
        "created": body.get("created", int(time.time())),
        "model": body.get("model"),
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": {"content": [{"token": t, "logprob": lp} for t, lp in zip(tokens, logprobs, strict=False)]},
                "finish_reason": "tool_calls" if message["tool_calls"] and finish == "stop" else finish,
                "stop_reason": choice.get("stop_reason"),
                "token_ids": list(choice.get("token_ids") or []),
            }
        ],
        "usage": body.get("usage"),
        "prompt_token_ids": ids if isinstance(ids, list) else list(ids),
    }


def _token_in(request: EngineRequest) -> bool:
    return request.prompt is not None and request.chain_call_id is not None


def planned(request: EngineRequest) -> dict[str, Any]:
    if _token_in(request):
        assert request.prompt is not None and request.chain_call_id is not None
        return stored_request(completion_body(request.chat_body, request.prompt), request.chain_call_id,
                              request.chat_body)  # fmt: skip
    return capture_fields(request.chat_body)


def _post(request: EngineRequest, path: str, body: dict[str, Any]) -> tuple[EngineReply, bool]:
    """One request, retried once with ``max_tokens`` fitted (in ``body``) when it asked past the context."""
    served = request.served_model
    reply = request.engines.post(request.session_id, path, body, served, kind=KIND, parse=request.parse)
    if (fitted := fit_max_tokens(body, reply)) is None:
        return reply, False
    body.update(fitted)
    return request.engines.post(request.session_id, path, body, served, kind=KIND, parse=request.parse), True


def ask(request: EngineRequest) -> Asked:
    if not _token_in(request):
        body = capture_fields(request.chat_body)
        reply, refitted = _post(request, "/v1/chat/completions", body)
        return Asked(body, reply, refitted)
    assert request.prompt is not None and request.chain_call_id is not None
    body = completion_body(request.chat_body, request.prompt)
    reply, refitted = _post(request, "/v1/completions", body)
    stored = stored_request(body, request.chain_call_id, request.chat_body)
    if reply.status_code == 200:
        answer = as_chat_answer(reply, request.prompt, bool(request.chat_body.get("tools")))
        reply = EngineReply(reply.url, 200, answer, reply.latency_ms)
    return Asked(stored, reply, refitted)


def count_tokens(request: EngineRequest, body: dict[str, Any]) -> EngineReply:
    return request.engines.post(request.session_id, "/tokenize", body, request.served_model)
