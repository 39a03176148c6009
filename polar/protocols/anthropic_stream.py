"""Anthropic's Messages event stream, synthesised from a complete rendered message (``anthropic.render_stream``).

    message_start → ping → per block: content_block_start, content_block_delta…, content_block_stop
    → message_delta (stop_reason, stop_sequence, cumulative usage) → message_stop

Each event is ``event: <type>\\ndata: <json>\\n\\n``; one block is open at a time, indices 0..n.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

from polar.protocols._base import sse


def event(kind: str, **data: Any) -> bytes:
    """One named event whose data repeats its type, as the API sends it."""
    return sse({"type": kind, **data}, event=kind)


def _delta(index: int, **delta: Any) -> bytes:
    return event("content_block_delta", index=index, delta=delta)


def _block_events(index: int, block: dict[str, Any], raw_arguments: Any) -> Iterator[bytes]:
    """One block: thinking (its text, then its signature), text, or tool_use (input as JSON text)."""
    kind = block["type"]
    if kind == "thinking":
        yield event("content_block_start", index=index, content_block={"type": "thinking", "thinking": "",
                                                                       "signature": ""})  # fmt: skip
        yield _delta(index, type="thinking_delta", thinking=block["thinking"])
        yield _delta(index, type="signature_delta", signature=block["signature"])
    elif kind == "text":
        yield event("content_block_start", index=index, content_block={"type": "text", "text": ""})
        yield _delta(index, type="text_delta", text=block["text"])
    else:
        yield event("content_block_start", index=index, content_block={**block, "input": {}})
        # The engine's argument text verbatim (protocols.md §6), so streamed and non-streamed input agree.
        verbatim = isinstance(raw_arguments, str) and raw_arguments.strip()
        partial = raw_arguments if verbatim else json.dumps(block["input"], ensure_ascii=False)
        yield _delta(index, type="input_json_delta", partial_json=partial)
    yield event("content_block_stop", index=index)


def events(message: dict[str, Any], raw_arguments: Sequence[Any] = ()) -> Iterator[bytes]:
    """The stream of ``message`` (a rendered Messages response); ``raw_arguments`` are the engine's argument
    strings of its tool_use blocks, in order."""
    head = {**message, "content": [], "stop_reason": None, "stop_sequence": None}
    yield event("message_start", message={**head, "usage": {**message["usage"], "output_tokens": 1}})
    yield event("ping")
    arguments = iter(raw_arguments)
    for index, block in enumerate(message["content"]):
        yield from _block_events(index, block, next(arguments, None) if block["type"] == "tool_use" else None)
    delta = {"stop_reason": message["stop_reason"], "stop_sequence": message["stop_sequence"]}
    yield event("message_delta", delta=delta, usage=message["usage"])
    yield event("message_stop")
