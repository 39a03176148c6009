"""Building vLLM's non-streaming response bodies (chat, completions, tokenize, models, errors) as plain dicts.

Field sets follow vLLM's pydantic models dumped in full, so absent optional fields appear as null, as a client
of vLLM sees them.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from polar.chat.completion_parser import ParsedCompletion
from polar.chat.errors import EngineRequestError
from polar.chat.tokenizer import Tokenizer
from polar.refengine.generation import Generation, TokenLogprob
from polar.refengine.protocol import OutputOptions


@dataclass(frozen=True)
class ResponseContext:
    """Identity of one response: its id, creation time and the served model name."""

    request_id: str
    model: str
    created: int

    @classmethod
    def new(cls, prefix: str, model: str, request_id: str | None = None) -> ResponseContext:
        """A context with vLLM's id format (`chatcmpl-<hex>`, `cmpl-<hex>`)."""
        return cls(f"{prefix}-{request_id or uuid.uuid4().hex}", model, int(time.time()))


def tool_call_ids(count: int) -> tuple[str, ...]:
    """Fresh tool call ids in vLLM's `chatcmpl-tool-<hex>` format."""
    return tuple(f"chatcmpl-tool-{uuid.uuid4().hex}" for _ in range(count))


def usage(gen: Generation, completion_tokens: int | None = None) -> dict[str, Any]:
    """vLLM's UsageInfo for a generation (or for the first `completion_tokens` of it, when streaming)."""
    done = len(gen.token_ids) if completion_tokens is None else completion_tokens
    prompt = len(gen.prompt_token_ids)
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + done,
        "completion_tokens": done,
        "prompt_tokens_details": None,
    }


def token_text(tok: Tokenizer, token_id: int, as_id: bool) -> str:
    """The `token` string of a logprob entry: the decoded token, or `token_id:<id>`."""
    if as_id:
        return f"token_id:{token_id}"
    return tok.token_bytes(token_id).decode("utf-8", errors="replace")


def chat_logprobs(tok: Tokenizer, entries: Sequence[TokenLogprob], output: OutputOptions) -> dict[str, Any] | None:
    """`choices[].logprobs` of a chat response: one content entry per sampled token."""
    if not output.logprobs:
        return None
    content = []
    for entry in entries:
        top = [
            {"token": token_text(tok, i, output.tokens_as_token_ids), "logprob": lp, "bytes": list(tok.token_bytes(i))}
            for i, lp in entry.top[: output.top_logprobs]
        ]
        content.append(
            {
                "token": token_text(tok, entry.token_id, output.tokens_as_token_ids),
                "logprob": entry.logprob,
                "bytes": list(tok.token_bytes(entry.token_id)),
                "top_logprobs": top,
            }
        )
    return {"content": content}


def chat_message(parsed: ParsedCompletion, ids: Sequence[str]) -> dict[str, Any]:
    """The assistant message of a chat choice: `reasoning` only, as vLLM since PR #33402 (the older
    `reasoning_content` is gone; `tool_calls` is dropped when empty, as ChatMessage's serializer does)."""
    calls = [
        {"id": ids[i], "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
        for i, call in enumerate(parsed.tool_calls)
    ]
    return {
        "role": "assistant",
        "content": parsed.content,
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
        **({"tool_calls": calls} if calls else {}),
        "reasoning": parsed.reasoning,
    }


def chat_finish_reason(gen: Generation, parsed: ParsedCompletion) -> str:
    """vLLM reports `tool_calls` whenever the tool parser found calls."""
    return "tool_calls" if parsed.tool_calls else gen.finish_reason


def _envelope(ctx: ResponseContext, kind: str, choice: dict[str, Any], gen: Generation, **extra: Any) -> dict[str, Any]:
    """The fields vLLM's chat and completion responses share around their one choice."""
    return {
        "id": ctx.request_id,
        "object": kind,
        "created": ctx.created,
        "model": ctx.model,
        "choices": [choice],
        "service_tier": None,
        "system_fingerprint": None,
        "usage": usage(gen),
        **extra,
        "kv_transfer_params": None,
    }


def chat_response(
    ctx: ResponseContext, tok: Tokenizer, gen: Generation, parsed: ParsedCompletion, output: OutputOptions
) -> dict[str, Any]:
    """A `chat.completion` body."""
    choice = {
        "index": 0,
        "message": chat_message(parsed, tool_call_ids(len(parsed.tool_calls))),
        "logprobs": chat_logprobs(tok, gen.logprobs, output),
        "finish_reason": chat_finish_reason(gen, parsed),
        "stop_reason": gen.stop_reason,
        "token_ids": list(gen.token_ids) if output.return_token_ids else None,
    }
    return _envelope(
        ctx,
        "chat.completion",
        choice,
        gen,
        prompt_logprobs=None,
        prompt_token_ids=list(gen.prompt_token_ids) if output.return_token_ids else None,
    )


def completion_logprobs(
    tok: Tokenizer,
    gen: Generation,
    output: OutputOptions,
    start: int = 0,
    stop: int | None = None,
    offset: int = 0,
) -> dict[str, Any] | None:
    """`choices[].logprobs` in the completions format for tokens `start:stop` (text offsets from `offset`)."""
    if not output.logprobs:
        return None
    tokens, token_logprobs, top_logprobs, text_offset = [], [], [], []
    for entry, piece in zip(gen.logprobs[start:stop], gen.pieces[start:stop], strict=True):
        tokens.append(token_text(tok, entry.token_id, output.tokens_as_token_ids))
        token_logprobs.append(entry.logprob)
        alternatives = entry.top[: max(1, output.top_logprobs)] or ((entry.token_id, entry.logprob),)
        top_logprobs.append({token_text(tok, i, output.tokens_as_token_ids): lp for i, lp in alternatives})
        text_offset.append(offset)
        offset += len(piece)
    return {
        "text_offset": text_offset,
        "token_logprobs": token_logprobs,
        "tokens": tokens,
        "top_logprobs": top_logprobs,
    }


def completion_response(
    ctx: ResponseContext, tok: Tokenizer, gen: Generation, output: OutputOptions, prompt_text: str
) -> dict[str, Any]:
    """A `text_completion` body (prompt ids are per choice here, unlike chat)."""
    prefix = prompt_text if output.echo else ""
    choice = {
        "index": 0,
        "text": prefix + gen.text,
        "logprobs": completion_logprobs(tok, gen, output, offset=len(prefix)),
        "finish_reason": gen.finish_reason,
        "stop_reason": gen.stop_reason,
        "token_ids": list(gen.token_ids) if output.return_token_ids else None,
        "prompt_logprobs": None,
        "prompt_token_ids": list(gen.prompt_token_ids) if output.return_token_ids else None,
    }
    return _envelope(ctx, "text_completion", choice, gen)


def models_response(model: str, max_model_len: int, created: int) -> dict[str, Any]:
    """`GET /v1/models` as vLLM lists its one served model."""
    card = {
        "id": model,
        "object": "model",
        "created": created,
        "owned_by": "vllm",
        "root": model,
        "parent": None,
        "max_model_len": max_model_len,
        "permission": [
            {
                "id": f"modelperm-{uuid.uuid4().hex}",
                "object": "model_permission",
                "created": created,
                "allow_create_engine": False,
                "allow_sampling": True,
                "allow_logprobs": True,
                "allow_search_indices": False,
                "allow_view": True,
                "allow_fine_tuning": False,
                "organization": "*",
                "group": None,
                "is_blocking": False,
            }
        ],
    }
    return {"object": "list", "data": [card]}


def error_body(message: str, error_type: str = "BadRequestError", code: int = 400) -> dict[str, Any]:
    """vLLM's (>= 0.10.1) error body."""
    return {"error": {"message": message, "type": error_type, "param": None, "code": code}}


def error_of(exc: EngineRequestError) -> dict[str, Any]:
    """The error body of an engine error."""
    return error_body(exc.message, exc.error_type, exc.status)
