"""The Responses event stream, synthesised from a complete response object (``openai_responses.render_response``).

Order (protocols.md §4): ``response.created``, ``response.in_progress``, then per output item ``output_item.added``,
its part and delta events, ``output_item.done``; last ``response.completed`` (``response.incomplete`` when the
answer was cut by the token limit). Every event is ``event: <type>`` + ``data: {"type", "sequence_number", …}``;
there is no ``[DONE]``. Codex reads items from ``output_item.done`` and needs ``summary_index`` /
``content_index`` on reasoning deltas.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Iterator
from typing import Any

from polar.protocols._base import sse


class _Events:
    """Numbers events in order."""

    def __init__(self) -> None:
        self.sequence = 0

    def __call__(self, kind: str, **fields: Any) -> bytes:
        event = sse({"type": kind, "sequence_number": self.sequence, **fields}, event=kind)
        self.sequence += 1
        return event


def _reasoning(emit: _Events, index: int, item: dict[str, Any]) -> Iterator[bytes]:
    at = {"item_id": item["id"], "output_index": index}
    yield emit("response.output_item.added", output_index=index, item={**item, "summary": [], "content": []})
    for number, part in enumerate(item.get("summary") or []):
        empty = {"type": "summary_text", "text": ""}
        yield emit("response.reasoning_summary_part.added", **at, summary_index=number, part=empty)
        yield emit("response.reasoning_summary_text.delta", **at, summary_index=number, delta=part["text"])
        yield emit("response.reasoning_summary_text.done", **at, summary_index=number, text=part["text"])
        yield emit("response.reasoning_summary_part.done", **at, summary_index=number, part=part)
    for number, part in enumerate(item.get("content") or []):
        yield emit("response.reasoning_text.delta", **at, content_index=number, delta=part["text"])
        yield emit("response.reasoning_text.done", **at, content_index=number, text=part["text"])
    yield emit("response.output_item.done", output_index=index, item=item)


def _message(emit: _Events, index: int, item: dict[str, Any]) -> Iterator[bytes]:
    at = {"item_id": item["id"], "output_index": index}
    added = {**item, "status": "in_progress", "content": []}
    yield emit("response.output_item.added", output_index=index, item=added)
    for number, part in enumerate(item["content"]):
        empty = {**part, "text": ""}
        yield emit("response.content_part.added", **at, content_index=number, part=empty)
        yield emit("response.output_text.delta", **at, content_index=number, delta=part["text"], logprobs=[])
        yield emit("response.output_text.done", **at, content_index=number, text=part["text"], logprobs=[])
        yield emit("response.content_part.done", **at, content_index=number, part=part)
    yield emit("response.output_item.done", output_index=index, item=item)


def _function_call(emit: _Events, index: int, item: dict[str, Any]) -> Iterator[bytes]:
    at = {"item_id": item["id"], "output_index": index}
    added = {**item, "arguments": "", "status": "in_progress"}
    yield emit("response.output_item.added", output_index=index, item=added)
    yield emit("response.function_call_arguments.delta", **at, delta=item["arguments"])
    yield emit("response.function_call_arguments.done", **at, name=item["name"], arguments=item["arguments"])
    yield emit("response.output_item.done", output_index=index, item=item)


def _custom_tool_call(emit: _Events, index: int, item: dict[str, Any]) -> Iterator[bytes]:
    at = {"item_id": item["id"], "output_index": index}
    yield emit("response.output_item.added", output_index=index, item={**item, "input": ""})
    yield emit("response.custom_tool_call_input.delta", **at, delta=item["input"])
    yield emit("response.custom_tool_call_input.done", **at, input=item["input"])
    yield emit("response.output_item.done", output_index=index, item=item)


_ITEMS = {
    "reasoning": _reasoning,
    "message": _message,
    "function_call": _function_call,
    "custom_tool_call": _custom_tool_call,
}


def stream_events(response: dict[str, Any]) -> Iterator[bytes]:
    """The events that deliver ``response`` (a complete response object) as a stream."""
    emit = _Events()
    pending = {**copy.deepcopy(response), "status": "in_progress", "output": [], "usage": None,
               "incomplete_details": None, "completed_at": None}  # fmt: skip
    yield emit("response.created", response=pending)
    yield emit("response.in_progress", response=pending)
    for index, item in enumerate(response["output"]):
        yield from _ITEMS[item["type"]](emit, index, item)
    final = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
    yield emit(final, response=response)


def failed_events(error: dict[str, Any]) -> bytes:
    """Ends a stream that failed mid-way: an ``error`` event, then ``response.failed`` with a server error."""
    failed = {"id": f"resp_{uuid.uuid4().hex}", "object": "response", "status": "failed", "output": [],
              "error": {"code": "server_error", "message": error["message"]}}  # fmt: skip
    event = {"type": "error", "code": error.get("code") or "server_error", "message": error["message"],
             "param": None, "error": error}  # fmt: skip
    return sse(event, event="error") + sse({"type": "response.failed", "response": failed}, event="response.failed")
