"""Captured calls read back whole.

``model_calls`` stores each call's prompt and payloads as deltas on earlier calls of the same session
(``polar.storage.prompts``, ``polar.storage.payloads``), so reading a call means reading its session's rows up to
it; the rows are small (that is the point of the deltas) and one indexed range scan fetches them:

    rows = session_rows(connection, session_id, up_to_seq=7)   # the stored columns, in seq order
    whole = rebuild(rows, wanted={call_id})                     # {call id: WholeCall}
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from polar.storage.columns import any_of
from polar.storage.models import ModelCall
from polar.storage.payloads import PARTS, full_payloads
from polar.storage.prompts import full_prompts

# What the rebuild reads of every row: these, and the payload columns wanted.
_KEYS = (
    ModelCall.id,
    ModelCall.seq,
    ModelCall.prompt_parent_id,
    ModelCall.prompt_prefix_len,
    ModelCall.prompt_token_ids,
    ModelCall.completion_token_ids,
    ModelCall.payload_parent_id,
)
STORED = (*_KEYS, ModelCall.request, ModelCall.normalized_request, ModelCall.response)


@dataclass(frozen=True)
class WholeCall:
    """A call's full prompt and its three payloads as captured."""

    prompt_token_ids: list[int]
    request: Any
    normalized_request: Any
    response: Any


def session_rows(
    connection: sa.Connection | Any,
    session_id: uuid.UUID,
    up_to_seq: int | None = None,
    columns: Sequence[Any] = (),
    parts: Sequence[str] = PARTS,
) -> list[Any]:
    """The session's rows (what the rebuild needs of the payload ``parts``, and ``columns``) in ``seq`` order, up
    to ``up_to_seq`` when given."""
    query = _rows(columns, parts).where(ModelCall.session_id == session_id).order_by(ModelCall.seq)
    if up_to_seq is not None:
        query = query.where(ModelCall.seq <= up_to_seq)
    return list(connection.execute(query).all())


def rows_by_session(
    connection: sa.Connection | Any,
    session_ids: Collection[uuid.UUID],
    columns: Sequence[Any] = (),
    parts: Sequence[str] = PARTS,
) -> dict[uuid.UUID, list[Any]]:
    """``session_rows`` of every one of ``session_ids`` in one query (each session's rows in ``seq`` order; a
    session without calls has an empty list)."""
    grouped: dict[uuid.UUID, list[Any]] = {session_id: [] for session_id in session_ids}
    if not grouped:
        return grouped
    query = _rows([ModelCall.session_id.label("of_session"), *columns], parts)
    query = query.where(ModelCall.session_id.in_(list(grouped))).order_by(ModelCall.session_id, ModelCall.seq)
    for row in connection.execute(query):
        grouped[row.of_session].append(row)
    return grouped


def _rows(columns: Sequence[Any], parts: Sequence[str]) -> sa.Select[Any]:
    return sa.select(*_KEYS, *(getattr(ModelCall, part) for part in parts), *columns)


def rebuild(
    rows: Sequence[Any], wanted: Collection[uuid.UUID] | None = None, prompts: bool = True, parts: Sequence[str] = PARTS
) -> dict[uuid.UUID, WholeCall]:
    """``wanted`` calls (default: every row) whole, from rows holding their ancestors and the payload ``parts``
    (``session_rows``; the other parts are None). Without ``prompts`` the full prompts are not joined (an empty
    list, and None where a payload held the prompt)."""
    full = full_prompts(rows, wanted) if prompts else {}
    payloads = full_payloads(rows, full, wanted, parts)
    return {
        call_id: WholeCall(full.get(call_id, []), *(found.get(part) for part in PARTS))
        for call_id, found in payloads.items()
    }


# Where a stored normalised request keeps the chat form it stands for when the engine got token ids instead
# (TITO's ``/v1/completions`` body, SGLang's ``/generate`` body).
CHAT_FORMS = ("polar_tito", "polar_chat")


def chat_form(normalized_request: Any) -> Any:
    """The chat request (messages, tools) a stored normalised request stands for."""
    if not isinstance(normalized_request, dict):
        return normalized_request
    return next((normalized_request[key] for key in CHAT_FORMS if normalized_request.get(key)), normalized_request)


def routed_experts_of_sessions(db: Any, session_ids: Collection[uuid.UUID]) -> dict[uuid.UUID, bytes]:
    """The expert routing stored for the calls of ``session_ids`` that have any, by call id. Read through an index
    of those calls alone (``ix_model_calls_routed_experts``): dense models store none, so a page of 1,000 sessions'
    trajectories reads nothing here, where a lookup by each trajectory's call ids probed the table 10,000 times."""
    if not session_ids:
        return {}
    rows = db.execute(
        sa.select(ModelCall.id, ModelCall.routed_experts).where(
            any_of(db, ModelCall.session_id, session_ids), ModelCall.routed_experts.is_not(None)
        )
    ).all()
    return {row.id: bytes(row.routed_experts) for row in rows}
