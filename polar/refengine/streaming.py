"""vLLM's server-sent-event chunks for a finished generation, each paired with how many tokens it carries.

The chat stream replays the sampled tokens through the streaming parser (`parse_partial`) and emits a chunk
whenever the visible message grows: reasoning, content, a tool call's header, or argument fragments. Tokens that
show nothing yet (markup) ride along with the next chunk, and the finish chunk carries whatever is left, so the
chunks' `token_ids` always add up to the non-streamed `token_ids` (vLLM may drop swallowed ids; we do not).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from polar.chat.completion_parser import PartialCompletion, parse_completion, parse_partial
from polar.chat.json_codec import encode
from polar.chat.tokenizer import TOOL_CALL_START, Tokenizer
from polar.refengine.generation import Generation
from polar.refengine.protocol import OutputOptions
from polar.refengine.responses import (
    ResponseContext,
    chat_finish_reason,
    chat_logprobs,
    completion_logprobs,
    tool_call_ids,
    usage,
)

DONE = b"data: [DONE]\n\n"


def sse(payload: dict[str, Any]) -> bytes:
    """One `data: {json}` event."""
    return b"data: " + encode(payload) + b"\n\n"


def _delta(prev: PartialCompletion, cur: PartialCompletion, ids: tuple[str, ...]) -> dict[str, Any]:
    delta: dict[str, Any] = {}
    if len(cur.reasoning) > len(prev.reasoning):
        delta["reasoning"] = cur.reasoning[len(prev.reasoning) :]
    if len(cur.content) > len(prev.content):
        delta["content"] = cur.content[len(prev.content) :]
    calls = []
    for index, (name, arguments) in enumerate(cur.tool_calls):
        prev_name, prev_args = prev.tool_calls[index] if index < len(prev.tool_calls) else (None, "")
        if name is None:
            continue
        if prev_name is None:
            fragment = arguments
        else:
            fragment = arguments[len(prev_args) :] if arguments.startswith(prev_args) else ""
        if prev_name is None:
            calls.append(
                {
                    "index": index,
                    "id": ids[index],
                    "type": "function",
                    "function": {"name": name, "arguments": fragment},
                }
            )
        elif fragment:
            calls.append({"index": index, "function": {"arguments": fragment}})
    if calls:
        delta["tool_calls"] = calls
    return delta


def chat_chunks(
    ctx: ResponseContext, tok: Tokenizer, gen: Generation, output: OutputOptions, parse_tools: bool
) -> Iterator[tuple[bytes, int]]:
    """The events of a streamed chat completion, ending with usage (if asked) and `[DONE]`."""
    base = {"id": ctx.request_id, "object": "chat.completion.chunk", "created": ctx.created, "model": ctx.model}
    first: dict[str, Any] = {
        **base,
        "choices": [
            {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        ],
    }
    if output.return_token_ids:
        first["prompt_token_ids"] = list(gen.prompt_token_ids)
    if output.continuous_usage_stats:
        first["usage"] = usage(gen, 0)
    yield sse(first), 0
    parsed = parse_completion(gen.text, parse_tools)
    ids = tool_call_ids(gen.text.count(TOOL_CALL_START))
    prev = PartialCompletion("", "")
    text, start = "", 0
    last = len(gen.token_ids) - 1
    for index, piece in enumerate(gen.pieces):
        text += piece
        cur = parse_partial(text, parse_tools)
        delta = _delta(prev, cur, ids)
        if index == last:
            choice = {
                "index": 0,
                "delta": delta or {"content": ""},
                "finish_reason": chat_finish_reason(gen, parsed),
                "stop_reason": gen.stop_reason,
            }
        elif delta:
            choice = {"index": 0, "delta": delta, "finish_reason": None}
        else:
            continue
        choice["logprobs"] = chat_logprobs(tok, gen.logprobs[start : index + 1], output)
        if output.return_token_ids:
            choice["token_ids"] = list(gen.token_ids[start : index + 1])
        chunk: dict[str, Any] = {**base, "choices": [choice]}
        if output.continuous_usage_stats:
            chunk["usage"] = usage(gen, index + 1)
        yield sse(chunk), index + 1 - start
        prev, start = cur, index + 1
    yield from _trailer(base, gen, output)


def completion_chunks(
    ctx: ResponseContext, tok: Tokenizer, gen: Generation, output: OutputOptions, prompt_text: str
) -> Iterator[tuple[bytes, int]]:
    """The events of a streamed text completion: one per sampled token, prompt ids on the first."""
    base = {"id": ctx.request_id, "object": "text_completion", "created": ctx.created, "model": ctx.model}
    offset = len(prompt_text) if output.echo else 0
    last = len(gen.token_ids) - 1
    for index, piece in enumerate(gen.pieces):
        echo = prompt_text if output.echo and index == 0 else ""
        choice: dict[str, Any] = {
            "index": 0,
            "text": echo + piece,
            "logprobs": _one_completion_logprob(tok, gen, output, index, offset),
            "finish_reason": gen.finish_reason if index == last else None,
            "stop_reason": gen.stop_reason if index == last else None,
        }
        offset += len(piece)
        if output.return_token_ids:
            choice["token_ids"] = [gen.token_ids[index]]
            if index == 0:
                choice["prompt_token_ids"] = list(gen.prompt_token_ids)
        chunk: dict[str, Any] = {**base, "choices": [choice]}
        if output.continuous_usage_stats:
            chunk["usage"] = usage(gen, index + 1)
        yield sse(chunk), 1
    yield from _trailer(base, gen, output)


def _one_completion_logprob(
    tok: Tokenizer, gen: Generation, output: OutputOptions, index: int, offset: int
) -> dict[str, Any] | None:
    return completion_logprobs(tok, gen, output, start=index, stop=index + 1, offset=offset)


def _trailer(base: dict[str, Any], gen: Generation, output: OutputOptions) -> Iterator[tuple[bytes, int]]:
    if output.include_usage:
        yield sse({**base, "choices": [], "usage": usage(gen)}), 0
    yield DONE, 0
