"""Why a call broke its chain, told from the messages: prefix merging (``prefix_merging``) sees only tokens, so a
break it records as ``diverged`` or ``shorter_prompt`` is explained here by comparing what the chain's last call
saw and answered with what the breaking call sent.

    record = explain(record, before=chain_messages, after=call_messages, tools_before=..., tools_after=...,
                     sampled=position_is_in_a_sampled_turn)

``before`` is the nearest trajectory's last call's messages plus its answer; ``after`` the breaking call's messages
(OpenAI chat dicts, as in the stored normalised request). Reasons, in the order they are tested:

- ``new_conversation`` / ``parallel`` (set by ``prefix_merging``, kept when the opening messages, the system
  prompt and first user message, differ): a title generator, a summariser, a sub-agent. A new chain, not a
  failure. When the messages show it continues the chain with only its opening changed, ``history_rewritten``;
  when the opening is the same, it is judged like any other break below (compaction right after the task looks
  like a new conversation to tokens alone).
- ``tools_changed``: the offered tools differ (they are rendered into the prompt).
- ``media_dropped`` / ``media_changed``: as many messages or more, and a message's images differ (the stored
  messages refer to each image by its sha256, ``polar.storage.media``): one the chain saw is gone (a harness that
  drops or elides old screenshots), or another image took its place.
- ``compaction``: fewer messages than before and different ones: earlier turns replaced by a summary.
- ``truncation``: the messages are a strict prefix of before: history cut back (a rewind, a retried turn).
- ``tool_result_rewritten``, ``history_rewritten`` (a system or user message changed, e.g. an injected
  reminder), ``answer_rewritten`` (the client changed the model's own message): the first differing message.
- ``reasoning_dropped``: the same messages, but an assistant turn's reasoning is gone (client or template).
- ``retokenized``: the same messages, reasoning included, and the tokens differ inside a sampled turn: the
  model's output re-rendered or re-tokenised differently from how it was sampled. Token-in-token-out fixes it.
- ``diverged`` / ``shorter_prompt``: nothing above explains it (or the bodies are gone): unexplained.

The record gains ``message_index`` (the first differing message in ``after``, when there is one) and ``detail``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, replace
from typing import Any

import orjson

from polar.chat.conversation import Message, ToolCall, normalise_messages
from polar.chat.errors import MessageFormatError
from polar.storage.calls.read import chat_form
from polar.storage.media import references

NEW_CHAIN = frozenset({"new_conversation", "parallel"})
UNEXPLAINED = frozenset({"diverged", "shorter_prompt"})


def messages_of(normalized_request: Mapping[str, Any] | None) -> list[dict[str, Any]] | None:
    """The chat messages a stored normalised request stands for (``polar.storage.calls.read.chat_form``)."""
    if not normalized_request:
        return None
    messages = chat_form(normalized_request).get("messages")
    return list(messages) if isinstance(messages, list) else None


def tools_of(normalized_request: Mapping[str, Any] | None) -> list[str]:
    """The names of the tools a stored normalised request offered."""
    body = chat_form(dict(normalized_request or {}))
    return [str((tool.get("function") or {}).get("name")) for tool in body.get("tools") or [] if isinstance(tool, dict)]


def answer_of(response: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The assistant message of a stored chat completion."""
    choices = (response or {}).get("choices") or []
    message = choices[0].get("message") if choices and isinstance(choices[0], dict) else None
    return dict(message) if isinstance(message, dict) else None


def same_history(before: Sequence[Any], after: Sequence[Any]) -> bool:
    """Whether ``after`` repeats ``before``'s messages except for what the model said (assistant turns, which a
    token-in-token-out continuation replaces with the sampled tokens anyway): same roles, and the same system,
    user and tool messages. False when the client compacted, cut or rewrote its history (or sent what cannot be
    read): then the continuation must be rendered from the messages, not the old tokens."""
    try:
        old, new = _plain(before), _plain(after)
    except MessageFormatError:
        return False
    if old is None or new is None or len(old) != len(new):
        return False
    return all(a.role == b.role and (a.role == "assistant" or a == b) for a, b in zip(old, new, strict=True))


def history_key(messages: Sequence[Any] | None) -> str | None:
    """A digest of what ``same_history`` compares of ``messages`` (roles; the system, user and tool messages), so
    that equal keys mean ``same_history`` holds (a key is never equal where it would not); None where it could never
    hold (no messages, or unreadable ones)."""
    try:
        plain = _plain(messages)
    except MessageFormatError:
        return None
    if plain is None:
        return None
    # orjson writes the messages (dataclasses, their fields in a fixed order) ~30x faster than asdict and json.dumps
    # did (3 ms of a TITO call at 40k tokens, twice). Only keys made by this function are ever compared.
    try:
        data = orjson.dumps([[m.role] if m.role == "assistant" else m for m in plain], default=repr)
    except TypeError:  # what orjson will not write (a dict with non-string keys in tool arguments)
        parts = [[m.role] if m.role == "assistant" else asdict(m) for m in plain]
        data = json.dumps(parts, sort_keys=True, default=repr, ensure_ascii=False).encode()
    return hashlib.sha256(data).hexdigest()


def explain(
    record: dict[str, Any],
    before: Sequence[Any] | None,
    after: Sequence[Any] | None,
    tools_before: Sequence[str] = (),
    tools_after: Sequence[str] = (),
    sampled: bool = False,
) -> dict[str, Any]:
    """``record`` with its reason told from the messages (unchanged when they are missing or unreadable)."""
    try:
        old, new = _plain(before), _plain(after)
    except MessageFormatError:
        return record
    if old is None or new is None:
        return record
    reason, index, detail = _judge(record["reason"], old, new, list(tools_before) != list(tools_after), sampled)
    if reason not in NEW_CHAIN and reason != "tools_changed" and len(new) >= len(old):
        reason, index, detail = _media_judged(before, after) or (reason, index, detail)
    return {**record, "reason": reason, "message_index": index, "detail": detail}


def _media_judged(before: Sequence[Any] | None, after: Sequence[Any] | None) -> tuple[str, int, str] | None:
    """``media_dropped`` or ``media_changed`` at the first message of ``before`` whose images ``after`` does not
    send alike; None when every message sends the same images."""
    old = [references(m) for m in before or ()]
    new = [references(m) for m in after or ()]
    for index, (was, now) in enumerate(zip(old, new, strict=False)):
        if was == now:
            continue
        gone = [sha for sha in was if sha not in now]
        if gone and len(now) < len(was):
            return "media_dropped", index, f"message {index} no longer sends {len(gone)} of its {len(was)} images"
        return "media_changed", index, f"message {index} sends other images than before"
    return None


def _plain(messages: Sequence[Any] | None) -> tuple[Message, ...] | None:
    """Messages as clients echo them: without the ids templates do not render (tool-call ids) and without the
    whitespace around text and reasoning (clients trim the model's "\n\n" between reasoning and a tool call)."""
    if not messages:
        return None
    normalised = normalise_messages([dict(m) for m in messages])
    return tuple(
        replace(
            m,
            content=m.content.strip(),
            reasoning=(m.reasoning or "").strip() or None,
            tool_call_id=None,
            tool_calls=tuple(ToolCall(c.name, c.arguments) for c in m.tool_calls),
        )
        for m in normalised
    )


def _opening(messages: tuple[Message, ...]) -> int:
    """How many messages open the conversation: the leading system messages and the first user message."""
    leading = next((i for i, m in enumerate(messages) if m.role != "system"), len(messages))
    return min(leading + 1, len(messages))


def _bare(message: Message) -> Message:
    return replace(message, reasoning=None)


def _judge(
    reason: str, old: tuple[Message, ...], new: tuple[Message, ...], tools_differ: bool, sampled: bool
) -> tuple[str, int | None, str]:
    first = next((i for i, (a, b) in enumerate(zip(old, new, strict=False)) if _bare(a) != _bare(b)), None)
    if reason in NEW_CHAIN and first is not None and first < _opening(old):
        continues = len(new) >= len(old) and _bare(new[len(old) - 1]) == _bare(old[-1])
        if continues:
            return "history_rewritten", first, f"the opening {new[first].role} message {first} changed"
        return reason, first, "a new chain: the opening (system prompt or first user message) differs"
    if tools_differ:
        return "tools_changed", None, "the offered tools differ"
    if first is None:
        if len(new) < len(old):
            return "truncation", len(new), f"history cut back from {len(old)} to {len(new)} messages"
        dropped = next(
            (i for i, (a, b) in enumerate(zip(old, new, strict=False)) if a.role == "assistant" and a.reasoning
             and not b.reasoning),
            None,
        )  # fmt: skip
        if dropped is not None:
            return "reasoning_dropped", dropped, "an assistant turn was sent back without its reasoning"
        if sampled:
            return "retokenized", None, "same messages; the model's turn was rendered or tokenised differently"
        return reason, None, "same messages, different tokens outside the model's turns"
    if len(new) < len(old):
        return "compaction", first, f"{len(old)} messages became {len(new)}; message {first} differs"
    role_old, role_new = old[first].role, new[first].role
    if role_old == role_new == "tool":
        return "tool_result_rewritten", first, f"tool result {first} differs from what the tool returned"
    if role_old == role_new == "assistant":
        return "answer_rewritten", first, f"assistant message {first} differs from what the model said"
    if role_old == role_new:
        return "history_rewritten", first, f"{role_new} message {first} was changed"
    return "history_rewritten", first, f"message {first} was a {role_old} message, now a {role_new} one"
