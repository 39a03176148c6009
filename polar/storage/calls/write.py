"""Persisting a model call. The call's sequence number comes from the session row, claimed in the same
transaction that inserts the call and only while the session is ``running``, so postrun never misses a call
whose answer reached the harness.

This is the proxy's hot path: it uses prebuilt Core statements on a plain connection (the ORM's per-statement
bookkeeping cost ~12 ms a call here; this costs one round trip per statement plus the commit), the two it makes on
every call run by psycopg directly (``polar.storage.driver_statements``).

A prompt that extends an earlier call of the session is stored as a delta on it (``polar.storage.prompts``):
one indexed SELECT of the session's earlier chains (id, length, hash) picks the parent before the insert. The
request, normalised request and response are stored as deltas too (``polar.storage.payloads``), on that parent or,
when the prompt extends none, on the agent's latest call: a second indexed SELECT reads the parent's
``payload_index`` (a few hashes), never its payloads. Both keep a session's bytes linear in its length.

The proxy process remembers the calls it recorded (``polar.storage.calls.recent``): while that memory is known to
hold every call of the session, a call's parents come from it and the parents statement does not run.

Those parents depend only on the calls already stored, not on the new call's answer, so the proxy reads them
(``read_parents``) while the engine generates and hands them to ``record_call``: after the answer, one round trip
(the insert) is left on the path to the client. So do the request's and the normalised request's deltas on the
agent's latest call (~1 ms at 32k tokens), when the request is what the engine is sent: ``record_call`` uses them
when that call is still the payload parent and the prompt could not have changed them.

The policy version a call ended under is read by the insert itself from ``engine_control`` (no extra round trip):
``policy_version_end``, and ``spans_policy_update`` when it differs from the version the call started under (the
engines held the call across a weight update). A trainer changing the version between the engine's answer and
this commit marks the call too: the mark errs towards dropping, never towards mixing policies unnoticed.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

import sqlalchemy as sa
from psycopg.types.numeric import Int4

from polar.contract.states import State
from polar.errors import SessionNotRunning
from polar.storage.calls.recent import Latest, RecentCalls
from polar.storage.database import Database
from polar.storage.driver_statements import DriverStatement
from polar.storage.early_connection import EarlyConnection
from polar.storage.models import EngineControl, ModelCall, Session
from polar.storage.payloads import PARTS, Written, capture_payload
from polar.storage.prompts import Chain, PromptDelta, encode_prompt

_sessions = Session.__table__
_calls = ModelCall.__table__
_control = EngineControl.__table__
# The policy version now (the trainer's ``POST /v1/engine/resume``), read when the call is recorded.
_VERSION_NOW = sa.select(_control.c.policy_version).where(_control.c.id == 1).scalar_subquery()
# A call is stored once however often its insert is retried (a commit whose acknowledgement a database restart
# swallowed): the sequence number is only claimed while the call's own id is not there yet.
_NEXT_SEQ = (
    sa.update(_sessions)
    .where(
        _sessions.c.id == sa.bindparam("session_id"),
        _sessions.c.state == State.RUNNING.value,
        ~sa.exists().where(_calls.c.id == sa.bindparam("call_id")),
    )
    .values(num_calls=_sessions.c.num_calls + 1)
    .returning(_sessions.c.num_calls)
)
_STORED = sa.select(_calls.c.id).where(_calls.c.id == sa.bindparam("call_id"))
# A parent is looked for among the session's latest calls only: the call a prompt extends is nearly always a
# recent one (parallel sub-agents interleave, hence the margin), and a bounded window keeps the lookup one short
# index range scan however long the session runs.
_PARENT_WINDOW = 64
_INSERT = sa.insert(_calls)
# Postgres: claim the sequence number and insert in ONE autocommitted statement (one round trip, one commit).
_NEXT_SEQ_CTE = _NEXT_SEQ.cte("next_seq")
# ``delivered`` keeps its default (true) until the answer is known to be lost (``mark_undelivered``); the policy
# columns are computed by the insert itself.
_DERIVED = ("seq", "created_at", "delivered", "policy_version_end", "spans_policy_update")
_VALUE_COLUMNS = [column for column in _calls.c if column.name not in _DERIVED]
_STARTED_UNDER = sa.bindparam("v_policy_version", type_=sa.Text())


class _Int4(sa.types.TypeDecorator[int]):
    """An integer sent as int4 whatever its value. psycopg sends an int as int2, int4 or int8 by its size, and its
    prepared-statement cache keys a statement by those types: an insert whose prompt lengths crossed 32,767 was a
    new statement each time and was almost never prepared (0.5 ms of parsing and planning a call)."""

    impl = sa.Integer
    cache_ok = True

    def process_bind_param(self, value: int | None, dialect: sa.Dialect) -> Any:
        return None if value is None else Int4(value)


def _bound_type(column: sa.Column[Any]) -> sa.types.TypeEngine[Any]:
    return _Int4() if type(column.type) is sa.Integer else column.type


_INSERT_CLAIMING_SEQ = DriverStatement(
    sa.insert(_calls)
    .from_select(
        [column.name for column in _VALUE_COLUMNS] + ["policy_version_end", "spans_policy_update", "seq"],
        # Prefixed names: a parameter named like a ``sessions`` column would become a SET in the CTE's UPDATE.
        sa.select(
            *[sa.bindparam(f"v_{c.name}", type_=_bound_type(c)) for c in _VALUE_COLUMNS],
            _VERSION_NOW,
            _STARTED_UNDER.is_distinct_from(_VERSION_NOW),
            _NEXT_SEQ_CTE.c.num_calls,
        ),
    )
    .returning(_calls.c.seq)
)


def _candidates(length: Callable[[Any], sa.ColumnElement[Any]]) -> sa.CompoundSelect[Any]:
    """In one round trip, the parents a call may have: ``is_chain`` rows are the successful calls among the
    session's latest ``_PARENT_WINDOW`` whose prompt + completion is no longer than ``max_length`` (``id,
    length, chain_hash, seq``); the other row is the agent's latest call with its ``payload_index``."""
    recent = (
        sa.select(
            _calls.c.id,
            (_calls.c.prompt_len + length(_calls.c.completion_token_ids)).label("length"),
            _calls.c.chain_hash,
            _calls.c.seq,
            _calls.c.status_code,
            _calls.c.synthesized,
        )
        .where(_calls.c.session_id == sa.bindparam("session_id"))
        .order_by(_calls.c.seq.desc())
        .limit(_PARENT_WINDOW)
        .subquery("recent")
    )
    chains = sa.select(
        sa.true().label("is_chain"), recent.c.id, recent.c.length, recent.c.chain_hash, recent.c.seq,
        sa.cast(sa.null(), sa.JSON).label("payload_index"),
    ).where(
        recent.c.status_code == 200, ~recent.c.synthesized, recent.c.chain_hash.is_not(None),
        recent.c.length <= sa.bindparam("max_length"),
    )  # fmt: skip
    latest = (
        sa.select(_calls.c.id, _calls.c.seq, _calls.c.payload_index)
        .where(
            _calls.c.session_id == sa.bindparam("session_id"),
            _calls.c.agent.is_not_distinct_from(sa.bindparam("agent")),
            _calls.c.payload_index.is_not(None),
        )
        .order_by(_calls.c.seq.desc())
        .limit(1)
        .subquery("latest")
    )
    agents_latest = sa.select(
        sa.false(), latest.c.id, sa.null(), sa.null(), latest.c.seq, latest.c.payload_index
    )  # fmt: skip
    return sa.union_all(chains, agents_latest)


_CANDIDATES_POSTGRES = DriverStatement(_candidates(sa.func.cardinality))
_CANDIDATES_SQLITE = DriverStatement(_candidates(sa.func.json_array_length))
_INDEX_OF_CALL = sa.select(_calls.c.id, _calls.c.payload_index).where(
    _calls.c.id == sa.bindparam("parent_id"), _calls.c.payload_index.is_not(None)
)


@dataclass(frozen=True)
class CallRecord:
    session_id: uuid.UUID
    agent: str | None
    provider: str
    model: str | None
    stream: bool
    prompt_token_ids: list[int]
    completion_token_ids: list[int]
    logprobs: list[float]
    finish_reason: str | None
    status_code: int
    latency_ms: float
    engine_latency_ms: float | None
    engine_url: str | None
    policy_version: str | None
    request: Any
    normalized_request: dict[str, Any]
    response: dict[str, Any]
    engine_kind: str | None = None  # vllm | sglang (polar.fleet.engines)
    routed_experts: bytes | None = None  # vLLM's per-token expert routing (.npy bytes), mixture-of-experts only
    sampling: dict[str, Any] | None = None  # {"requested": …, "used": …} (polar.proxy.sampling)
    synthesized: bool = False  # Polar's own answer, no model tokens (polar.proxy.budget)
    failure_kind: str | None = None  # why the engine failed the call (``ModelCall.failure_kind``)
    media: list[dict[str, Any]] | None = None  # its images and their spans (``polar.storage.media``)


@dataclass(frozen=True)
class Parents:
    """What a call's deltas may be taken against, as ``_CANDIDATES_POSTGRES`` reads it: the session's recent chains
    (oldest first) and the agent's latest call with its ``payload_index`` (None: the agent has none); and, computed
    early, payload parts as ``capture_payload`` stores them against that latest call (``part: (stored, index)``)."""

    chains: list[Chain]
    latest: Any
    payloads: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    prompt: Sequence[int] | None = None  # the prompt those payloads were stored with (None: they hold none)
    seqs: list[int] | None = None  # the chains' sequence numbers, when read from the database (None: from memory)

    def as_read(self) -> tuple[list[tuple[int, Chain]], Latest | None] | None:
        """What ``RecentCalls.recorded`` refreshes its entry with: these parents, when they were read."""
        if self.seqs is None:
            return None
        latest = self.latest
        return list(zip(self.seqs, self.chains, strict=True)), (
            None if latest is None else Latest(latest.id, latest.seq, latest.payload_index)
        )


# Read before the answer is known, so no prompt length bounds it: ``encode_prompt`` skips chains longer than the
# prompt it gets.
_ANY_LENGTH = 2**31 - 1


def read_parents(
    db: Database,
    session_id: uuid.UUID,
    agent: str | None,
    payloads: Mapping[str, Any] | None = None,
    prompt: Sequence[int] | None = None,
    recent: RecentCalls | None = None,
) -> Parents:
    """The parents a call of ``session_id``'s ``agent`` may have among the calls stored now (Postgres), with the
    ``payloads`` given (the call's request parts, by name) stored against the agent's latest call, for ``prompt``
    (the token prompt sent, when the proxy built it: TITO); from ``recent`` when it knows them."""
    parents = _remembered(recent, session_id, agent)
    if parents is None:
        with db.autocommit() as connection:
            parents = _parents(connection, _CANDIDATES_POSTGRES, session_id, agent, _ANY_LENGTH)
    if not payloads:
        return parents
    return replace(parents, payloads=_early_payloads(payloads, parents.latest, prompt), prompt=prompt)


def _early_payloads(
    payloads: Mapping[str, Any], latest: Any, prompt: Sequence[int] | None
) -> dict[str, tuple[Any, Any]]:
    """``payloads`` as deltas on ``latest``, before the engine has read the call's prompt; none if, without a
    ``prompt``, one holds a list of ints, which the prompt might equal (stored as a reference to it)."""
    index, written, found = latest.payload_index if latest is not None else None, Written(), {}
    for part, payload in payloads.items():
        against = None if index is None else (index.get(part) or {})
        found[part] = capture_payload(payload, against, prompt, written)
    return {} if written.int_lists else found


def record_call(
    db: Database,
    record: CallRecord,
    call_id: uuid.UUID | None = None,
    parents: Parents | None = None,
    recent: RecentCalls | None = None,
    insert_on: EarlyConnection | None = None,
) -> uuid.UUID:
    """Store ``record`` as ``call_id`` (new if not given; storing the same id again stores nothing); raises
    ``SessionNotRunning`` (and stores nothing) once the session has moved on. ``parents``, read by
    ``read_parents`` for this call's session and agent, saves reading them here; so does ``recent`` (Postgres),
    which learns of the call once it is stored. ``insert_on``: the connection to insert on, woken while the answer was
    read (``polar.storage.early_connection``)."""
    call_id = call_id or uuid.uuid4()
    # Shallow on purpose: dataclasses.asdict deep-copies every token list and payload (~1 ms a call).
    values = {"id": call_id, **{field.name: getattr(record, field.name) for field in fields(record)}}
    if db.is_postgres:
        with insert_on.use() if insert_on is not None else db.autocommit() as connection:
            # A parent read outside the insert is still a committed, immutable row: at worst a concurrent
            # call's prompt is stored against an older parent (or in full).
            if parents is None:
                parents = _remembered(recent, record.session_id, record.agent)
            if parents is None:
                parents = _parents(connection, _CANDIDATES_POSTGRES, record.session_id, record.agent,
                                   len(record.prompt_token_ids))  # fmt: skip
            values.update(_stored_forms(connection, parents, record))
            prefixed = {f"v_{name}": value for name, value in values.items()}
            bound = {"session_id": record.session_id, "call_id": call_id, **prefixed}
            seq = _INSERT_CLAIMING_SEQ.scalar(connection, bound)
            stored = seq is not None or connection.execute(_STORED, {"call_id": call_id}).first() is not None
        if recent is not None and seq is not None:
            recent.recorded(record.session_id, record.agent, Latest(call_id, seq, values["payload_index"]),
                            _chain(call_id, record, values), parents.as_read())  # fmt: skip
        elif recent is not None and not stored:
            recent.forget(record.session_id)
    else:  # SQLite has no data-modifying CTEs: the same in one transaction
        with db.engine.begin() as connection:
            seq = connection.execute(_NEXT_SEQ, {"session_id": record.session_id, "call_id": call_id}).scalar()
            if seq is not None:
                found = _parents(connection, _CANDIDATES_SQLITE, record.session_id, record.agent,
                                 len(record.prompt_token_ids))  # fmt: skip
                values.update(_stored_forms(connection, found, record))
                ended_under = connection.execute(sa.select(_VERSION_NOW)).scalar()
                values.update(policy_version_end=ended_under, spans_policy_update=ended_under != record.policy_version)
                connection.execute(_INSERT, {"seq": seq, **values})
            stored = seq is not None or connection.execute(_STORED, {"call_id": call_id}).first() is not None
    if not stored:
        raise SessionNotRunning("this session is no longer running; its proxy key has expired")
    return call_id


def mark_undelivered(db: Database, call_id: uuid.UUID) -> None:
    """Mark a stored call as never delivered to its harness (``ModelCall.delivered``)."""
    with db.engine.begin() as connection:
        connection.execute(sa.update(_calls).where(_calls.c.id == call_id).values(delivered=False))


def _remembered(recent: RecentCalls | None, session_id: uuid.UUID, agent: str | None) -> Parents | None:
    found = recent.parents(session_id, agent) if recent is not None else None
    return None if found is None else Parents(*found)


def _chain(call_id: uuid.UUID, record: CallRecord, values: Mapping[str, Any]) -> Chain | None:
    """What a later prompt may extend of a stored call (the parents query's ``is_chain`` rows), or None."""
    if record.status_code != 200 or record.synthesized or values["chain_hash"] is None:
        return None
    return Chain(call_id, values["prompt_len"] + len(record.completion_token_ids), values["chain_hash"])


def _parents(
    connection: sa.Connection,
    candidates: DriverStatement,
    session_id: uuid.UUID,
    agent: str | None,
    max_length: int,
) -> Parents:
    bounds = {"session_id": session_id, "max_length": max_length, "agent": agent}
    rows = candidates.rows(connection, bounds)
    chained = sorted((row for row in rows if row.is_chain), key=lambda row: row.seq)
    chains = [Chain(row.id, row.length, row.chain_hash) for row in chained]
    latest = next((row for row in rows if not row.is_chain), None)
    return Parents(chains, latest, seqs=[row.seq for row in chained])


def _stored_forms(connection: sa.Connection, parents: Parents, record: CallRecord) -> dict[str, Any]:
    """The prompt and payload columns of ``record``: deltas on the earlier calls it extends."""
    delta = encode_prompt(record.prompt_token_ids, record.completion_token_ids, parents.chains)
    return {
        "prompt_token_ids": delta.token_ids,
        "prompt_parent_id": delta.parent_id,
        "prompt_prefix_len": delta.prefix_len,
        "prompt_len": delta.prompt_len,
        "chain_hash": delta.chain_hash,
        **_payloads(connection, record, delta, parents.latest, _early(parents, record)),
    }


def _early(parents: Parents, record: CallRecord) -> Mapping[str, tuple[Any, Any]]:
    """The payloads stored early that still hold: stored with no prompt, or with the one the engine read."""
    if parents.prompt is None or parents.prompt == record.prompt_token_ids:
        return parents.payloads
    return {}


def _payloads(
    connection: sa.Connection,
    record: CallRecord,
    delta: PromptDelta,
    latest: Any,
    early: Mapping[str, tuple[Any, Any]],
) -> dict[str, Any]:
    """The three payloads as deltas on the prompt's parent (else the agent's latest call), and their index; the
    ``early`` ones (``Parents.payloads``) as they are when that parent is the agent's latest call."""
    parent = latest
    if delta.parent_id is not None and (latest is None or latest.id != delta.parent_id):  # rare: interleaved chains
        parent = connection.execute(_INDEX_OF_CALL, {"parent_id": delta.parent_id}).first()
    parent_index = parent.payload_index if parent is not None else None
    columns: dict[str, Any] = {"payload_parent_id": parent.id if parent is not None else None}
    index: dict[str, Any] = {}
    written = Written()  # the request and the normalised request share their messages and tools
    for part in PARTS:
        if parent is latest and part in early:  # computed while the engine generated, against the same parent
            columns[part], index[part] = early[part]
            continue
        against = None if parent_index is None else (parent_index.get(part) or {})
        columns[part], index[part] = capture_payload(getattr(record, part), against, record.prompt_token_ids, written)
    columns["payload_index"] = index
    return columns
