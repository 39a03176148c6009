"""Token-in-token-out (TITO): when a harness resends earlier turns, the next prompt is built from the session's
own previous prompt + the sampled token ids + the newly rendered tail, and the engine is asked with token ids
(``/v1/completions``, ``polar.fleet.backends.vllm``). Re-rendering an assistant turn (a template that strips
earlier reasoning, a client that drops it) can then never break the token chain that training relies on.

This module finds the chain a request continues (``find_link``) and the tip an answer leaves (``tip_of``); the
tail is found without knowing the chat template (``polar.proxy.tito_tails``).
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from polar.protocols import EngineAnswer
from polar.proxy.tito_tips import Tip, TipStore, identity_digests, tip
from polar.reconstruction.break_reasons import history_key, messages_of, same_history, tools_of
from polar.storage.calls.read import ANSWER_COLUMNS, rebuild, session_rows
from polar.storage.database import Database
from polar.storage.models import Session, Task
from polar.storage.prompts import full_prompts

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ChainLink:
    """The earlier call a new request continues: its exact tokens and where it sits in the new messages."""

    call_id: uuid.UUID
    prompt_ids: list[int]
    completion_ids: list[int]
    finish_reason: str | None
    message_index: int


def enabled(db: Database, session_id: uuid.UUID) -> bool:
    """Whether the session's task asked for TITO (``token_in_token_out`` in the TaskRequest)."""
    with db.autocommit() as connection:
        spec = connection.execute(
            sa.select(Task.spec).join(Session, Session.task_pk == Task.id).where(Session.id == session_id)
        ).scalar()
    return bool((spec or {}).get("token_in_token_out"))


def _identities(message: dict[str, Any]) -> set[tuple[Any, ...]]:
    """What ties a resent assistant message to the call that produced it: its tool-call ids, or the calls' names
    and parsed arguments (Factory's Droid resends a call under an id of its own, its arguments re-serialised), else
    its text. A match is only a candidate: ``find_link`` still checks the history before it."""
    calls = message.get("tool_calls") or []
    if calls:
        return {("calls", tuple(str(call.get("id")) for call in calls)), ("named", tuple(map(_call_key, calls)))}
    return {("text", str(message.get("content") or "").strip())}


def _call_key(call: Any) -> tuple[str, str]:
    function = (call.get("function") if isinstance(call, dict) else None) or {}
    arguments = function.get("arguments")
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
        canonical = json.dumps(parsed, sort_keys=True)
    except (ValueError, TypeError, RecursionError):  # not JSON, or nested past the parser's stack
        canonical = str(arguments)
    return str(function.get("name")), canonical


def find_link(
    db: Database,
    session_id: uuid.UUID,
    agent: str | None,
    messages: Sequence[Any],
    tools: Sequence[Any] = (),
    tips: TipStore | None = None,
) -> ChainLink | None:
    """The session's call (same agent) whose answer is the LAST assistant message of ``messages``, if any, and
    only if the messages before it are that call's own (``break_reasons.same_history``) with the same tools: a
    client that compacted or rewrote its history is rendered from its messages, not continued from old tokens.

    The agent's latest tips (``polar.proxy.tito_tips``) answer without reading the session; only when none of them
    is the call (or its history differs, which ``same_history`` then judges) is the session read back."""
    index = next((i for i in range(len(messages) - 1, -1, -1) if messages[i].get("role") == "assistant"), None)
    if index is None:
        return None
    wanted = _identities(messages[index])
    if tips is not None:
        digests = identity_digests(wanted)
        found = next((t for t in tips.recent(session_id, agent) if t.identities & digests), None)
        if found is not None and _tip_continues(found, messages[:index], tools):
            return ChainLink(found.call_id, found.prompt_ids, found.completion_ids, found.finish_reason, index)
    return _find_link_in_session(db, session_id, agent, messages, tools, index, wanted)


def _tip_continues(found: Tip, history: Sequence[Any], tools: Sequence[Any]) -> bool:
    if found.tools != tuple(tools_of({"tools": list(tools)})):
        return False
    key = history_key(history)
    return key is not None and key == found.history


def tip_of(call_id: uuid.UUID, chat_body: dict[str, Any], answer: EngineAnswer) -> Tip | None:
    """What a later call needs of this answered call (``answer``: the chat completion the proxy captured, as
    ``capture`` stores it) to continue it; None when nothing could continue it (unreadable messages, no ids)."""
    history = history_key(chat_body.get("messages") or [])
    if history is None or not answer.prompt_token_ids:
        return None
    tools = tools_of({"tools": list(chat_body.get("tools") or [])})
    prompt, completion = answer.prompt_token_ids, answer.completion_token_ids
    return tip(call_id, _identities(answer.message), history, tools, prompt, completion, answer.finish_reason)


def _find_link_in_session(
    db: Database,
    session_id: uuid.UUID,
    agent: str | None,
    messages: Sequence[Any],
    tools: Sequence[Any],
    index: int,
    wanted: set[tuple[Any, ...]],
) -> ChainLink | None:
    """``find_link`` by reading the session's calls back (every call's response; O(calls))."""
    with db.autocommit() as connection:
        rows = session_rows(connection, session_id, columns=ANSWER_COLUMNS, parts=["response"])
    candidates = [row for row in rows if row.status_code == 200 and row.agent == agent]
    answers = rebuild(rows, {row.id for row in candidates}, prompts=False, parts=["response"])
    for row in reversed(candidates):
        answer = ((answers[row.id].response or {}).get("choices") or [{}])[0].get("message") or {}
        if _identities(answer) & wanted:
            if not _continues(_history_rows(db, session_id, row.seq), row.id, messages[:index], tools):
                return None
            prompt = full_prompts(rows, {row.id})[row.id]
            return ChainLink(row.id, prompt, list(row.completion_token_ids), row.finish_reason, index)
    return None


def _history_rows(db: Database, session_id: uuid.UUID, up_to_seq: int) -> list[Any]:
    """The rows that rebuild the normalised requests up to ``up_to_seq``."""
    with db.autocommit() as connection:
        return session_rows(connection, session_id, up_to_seq=up_to_seq, parts=["normalized_request"])


def _continues(rows: list[Any], call_id: uuid.UUID, history: Sequence[Any], tools: Sequence[Any]) -> bool:
    """Whether ``history`` (the messages before the resent answer) is what call ``call_id`` itself was sent."""
    stored = rebuild(rows, {call_id}, prompts=False, parts=["normalized_request"])[call_id].normalized_request
    if tools_of(stored) != tools_of({"tools": list(tools)}):
        return False
    return same_history(messages_of(stored) or [], history)
