"""Captured calls read back: whole, and the queries the rest of Polar reads ``model_calls`` with.

``model_calls`` stores each call's prompt and payloads as deltas on earlier calls of the same session
(``polar.storage.prompts``, ``polar.storage.payloads``), so reading a call means reading its session's rows up to
it; the rows are small (that is the point of the deltas) and one indexed range scan fetches them:

    rows = session_rows(connection, session_id, up_to_seq=7)   # the stored columns, in seq order
    whole = rebuild(rows, wanted={call_id})                     # {call id: WholeCall}

The column sets callers pass as ``columns`` are named here (``CALL_COLUMNS``, ``SUMMARY_COLUMNS``,
``ANSWER_COLUMNS``), and so are the smaller reads: the pages of a session's calls (``count_calls``,
``seqs_at_offset``, ``seqs_after``, ``call_place``), what postrun judges a session by (``answered_calls``,
``last_answer_at``, ``engine_failures``), a trajectory's call spans (``span_rows``) and where a session is pinned
(``pinned_engine``).
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from polar.storage.columns import any_of
from polar.storage.database import Database
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
# What a call's JSON reads besides the rebuilt prompt and payloads (``STORED``): the rollout API's session calls
# (``polar.lifecycle.sessions``).
CALL_COLUMNS = (
    ModelCall.session_id, ModelCall.agent, ModelCall.provider, ModelCall.model, ModelCall.stream, ModelCall.logprobs,
    ModelCall.finish_reason, ModelCall.status_code, ModelCall.latency_ms, ModelCall.engine_latency_ms,
    ModelCall.policy_version, ModelCall.created_at, ModelCall.delivered, ModelCall.policy_version_end,
    ModelCall.spans_policy_update, ModelCall.engine_kind, ModelCall.routed_experts, ModelCall.sampling,
    ModelCall.synthesized, ModelCall.media,
)  # fmt: skip
# What the inspection pages show of a call besides its payloads (``polar.inspection.calls``).
SUMMARY_COLUMNS = (
    ModelCall.session_id, ModelCall.agent, ModelCall.provider, ModelCall.model, ModelCall.stream,
    ModelCall.prompt_len, ModelCall.finish_reason, ModelCall.status_code, ModelCall.latency_ms,
    ModelCall.engine_latency_ms, ModelCall.engine_url, ModelCall.policy_version, ModelCall.created_at,
    ModelCall.policy_version_end, ModelCall.spans_policy_update, ModelCall.engine_kind, ModelCall.media,
)  # fmt: skip
# What TITO reads of every call of a session to find the answer a request resends (``polar.proxy.tito``).
ANSWER_COLUMNS = (ModelCall.agent, ModelCall.status_code, ModelCall.finish_reason)


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


def count_calls(db: Any, session_id: uuid.UUID) -> int:
    """How many calls the session has stored."""
    in_session = ModelCall.session_id == session_id
    return int(db.scalar(sa.select(sa.func.count()).select_from(ModelCall).where(in_session)) or 0)


def seqs_at_offset(db: Any, session_id: uuid.UUID, offset: int, limit: int) -> Sequence[int]:
    """The ``seq`` of the session's calls ``offset`` … ``offset + limit`` in ``seq`` order (a page by offset, as
    the inspection pages read them)."""
    in_session = ModelCall.session_id == session_id
    return db.scalars(
        sa.select(ModelCall.seq).where(in_session).order_by(ModelCall.seq).limit(limit).offset(offset)
    ).all()


def seqs_after(db: Any, session_id: uuid.UUID, after: int, limit: int) -> Sequence[int]:
    """The ``seq`` of the session's calls numbered above ``after``, at most ``limit``, in ``seq`` order (a page by
    keyset, as the rollout API reads them)."""
    return db.scalars(
        sa.select(ModelCall.seq)
        .where(ModelCall.session_id == session_id, ModelCall.seq > after)
        .order_by(ModelCall.seq)
        .limit(limit)
    ).all()


def call_place(db: Any, call_id: uuid.UUID) -> Any:
    """Where call ``call_id`` sits: its ``(session_id, seq)`` row, or None for an unknown call."""
    return db.execute(sa.select(ModelCall.session_id, ModelCall.seq).where(ModelCall.id == call_id)).first()


def _answered(session_id: uuid.UUID) -> tuple[sa.ColumnElement[bool], ...]:
    """The session's calls whose answer counts: the engine answered (200), the harness got the answer, and it is
    no answer of Polar's own (``synthesized``)."""
    return (
        ModelCall.session_id == session_id,
        ModelCall.status_code == 200,
        ModelCall.delivered,
        ~ModelCall.synthesized,
    )


def answered_calls(db: Any, session_id: uuid.UUID) -> Sequence[Any]:
    """The session's successful calls whose answers reached the harness, in ``seq`` order: what a reconstruction
    reads of each (prompts as stored deltas, ``polar.storage.prompts.prompt_views`` reads them)."""
    return db.execute(
        sa.select(
            ModelCall.id,
            ModelCall.seq,
            ModelCall.agent,
            ModelCall.prompt_parent_id,
            ModelCall.prompt_prefix_len,
            ModelCall.prompt_token_ids,
            ModelCall.completion_token_ids,
            ModelCall.logprobs,
            ModelCall.finish_reason,
            ModelCall.media,
            ModelCall.policy_version,
            ModelCall.policy_version_end,
        )
        .where(*_answered(session_id))
        .order_by(ModelCall.seq)
    ).all()


def answered_seconds(db: Any, session_id: uuid.UUID) -> float:
    """The summed wall time of the session's answered calls, as the proxy timed them (parallel calls add up)."""
    total = db.scalar(sa.select(sa.func.sum(ModelCall.latency_ms)).where(*_answered(session_id)))
    return float(total or 0) / 1000


def last_answer_at(db: Any, session_id: uuid.UUID) -> datetime | None:
    """When the session's last answer that reached its harness was recorded (None: it got none)."""
    return db.scalar(sa.select(sa.func.max(ModelCall.created_at)).where(*_answered(session_id)))


def engine_failures(db: Any, session_id: uuid.UUID, statuses: Sequence[int]) -> Sequence[Any]:
    """The session's calls the engine failed (answered with one of ``statuses``), by ``failure_kind``: rows of
    ``(failure_kind, count, last created_at)``."""
    return db.execute(
        sa.select(ModelCall.failure_kind, sa.func.count(), sa.func.max(ModelCall.created_at))
        .where(ModelCall.session_id == session_id, ModelCall.status_code.in_(statuses))
        .group_by(ModelCall.failure_kind)
    ).all()


def span_rows(db: Any, call_ids: Collection[uuid.UUID]) -> Sequence[Any]:
    """What a trajectory's call spans need of the calls ``call_ids``: id, seq, agent, finish reason, prompt length
    and sampled tokens (``polar.inspection.trajectory_view``)."""
    return db.execute(
        sa.select(ModelCall.id, ModelCall.seq, ModelCall.agent, ModelCall.finish_reason, ModelCall.prompt_len,
                  ModelCall.completion_token_ids).where(ModelCall.id.in_(call_ids))
    ).all()  # fmt: skip


_PINNED = (
    sa.select(ModelCall.engine_url, ModelCall.engine_kind)
    .where(ModelCall.session_id == sa.bindparam("session_id"), ModelCall.engine_url.is_not(None))
    .order_by(ModelCall.seq.desc())
    .limit(1)
)


def pinned_engine(db: Database, session_id: uuid.UUID) -> str | None:
    """The engine URL that served the session's latest call, if any (``polar.fleet.overview``)."""
    with db.autocommit() as connection:
        row = connection.execute(_PINNED, {"session_id": session_id}).first()
    return row.engine_url if row is not None else None
