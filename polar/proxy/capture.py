"""Persisting a model call. The call's sequence number comes from the session row, claimed in the same
transaction that inserts the call and only while the session is ``running``, so postrun never misses a call
whose answer reached the harness.

This is the proxy's hot path: it uses prebuilt Core statements on a plain connection (the ORM's per-statement
bookkeeping cost ~12 ms a call here; this costs one round trip per statement plus the commit).

A prompt that extends an earlier call of the session is stored as a delta on it (``polar.storage.prompts``):
one indexed SELECT of the session's earlier chains (id, length, hash) picks the parent before the insert.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import sqlalchemy as sa

from polar.errors import SessionNotRunning
from polar.lifecycle.states import State
from polar.storage.database import Database
from polar.storage.models import ModelCall, Session, Task
from polar.storage.prompts import Chain, encode_prompt

_sessions = Session.__table__
_calls = ModelCall.__table__
_tasks = Task.__table__
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
_VALUE_COLUMNS = [column for column in _calls.c if column.name not in ("seq", "created_at")]
_INSERT_CLAIMING_SEQ = (
    sa.insert(_calls)
    .from_select(
        [column.name for column in _VALUE_COLUMNS] + ["seq"],
        # Prefixed names: a parameter named like a ``sessions`` column would become a SET in the CTE's UPDATE.
        sa.select(*[sa.bindparam(f"v_{c.name}", type_=c.type) for c in _VALUE_COLUMNS], _NEXT_SEQ_CTE.c.num_calls),
    )
    .returning(_calls.c.seq)
)


def _chains(length: Callable[[Any], sa.ColumnElement[Any]]) -> sa.Select[Any]:
    """The successful calls among the session's latest ``_PARENT_WINDOW`` whose prompt + completion is no
    longer than ``max_length``, oldest first: ``(id, length, chain_hash)``."""
    recent = (
        sa.select(
            _calls.c.id,
            (_calls.c.prompt_len + length(_calls.c.completion_token_ids)).label("length"),
            _calls.c.chain_hash,
            _calls.c.seq,
            _calls.c.status_code,
        )
        .where(_calls.c.session_id == sa.bindparam("session_id"))
        .order_by(_calls.c.seq.desc())
        .limit(_PARENT_WINDOW)
        .subquery("recent")
    )
    return (
        sa.select(recent.c.id, recent.c.length, recent.c.chain_hash)
        .where(
            recent.c.status_code == 200,
            recent.c.chain_hash.is_not(None),
            recent.c.length <= sa.bindparam("max_length"),
        )
        .order_by(recent.c.seq)
    )


_CHAINS_POSTGRES = _chains(sa.func.cardinality)
_CHAINS_SQLITE = _chains(sa.func.json_array_length)
# With the task's call limits (polar.proxy.limits): read from its spec in the same round trip.
_SESSION_FOR_KEY = (
    sa.select(
        _sessions.c.id,
        _sessions.c.state,
        _tasks.c.spec["max_concurrent_calls"].as_integer().label("max_concurrent_calls"),
        _tasks.c.spec["max_calls"].as_integer().label("max_calls"),
        _tasks.c.spec["timeout_seconds"].as_float().label("timeout_seconds"),
    )
    .join(_tasks, _tasks.c.id == _sessions.c.task_pk)
    .where(_sessions.c.proxy_key_hash == sa.bindparam("key_hash"))
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


def record_call(db: Database, record: CallRecord, call_id: uuid.UUID | None = None) -> uuid.UUID:
    """Store ``record`` as ``call_id`` (new if not given; storing the same id again stores nothing); raises
    ``SessionNotRunning`` (and stores nothing) once the session has moved on."""
    call_id = call_id or uuid.uuid4()
    # Shallow on purpose: dataclasses.asdict deep-copies every token list and payload (~1 ms a call).
    values = {"id": call_id, **{field.name: getattr(record, field.name) for field in fields(record)}}
    if db.is_postgres:
        with db.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
            # A parent read outside the insert is still a committed, immutable row: at worst a concurrent
            # call's prompt is stored against an older parent (or in full).
            values.update(_delta(connection, _CHAINS_POSTGRES, record))
            prefixed = {f"v_{name}": value for name, value in values.items()}
            bound = {"session_id": record.session_id, "call_id": call_id, **prefixed}
            seq = connection.execute(_INSERT_CLAIMING_SEQ, bound).scalar()
            stored = seq is not None or connection.execute(_STORED, {"call_id": call_id}).first() is not None
    else:  # SQLite has no data-modifying CTEs: the same in one transaction
        with db.engine.begin() as connection:
            seq = connection.execute(_NEXT_SEQ, {"session_id": record.session_id, "call_id": call_id}).scalar()
            if seq is not None:
                values.update(_delta(connection, _CHAINS_SQLITE, record))
                connection.execute(_INSERT, {"seq": seq, **values})
            stored = seq is not None or connection.execute(_STORED, {"call_id": call_id}).first() is not None
    if not stored:
        raise SessionNotRunning("this session is no longer running; its proxy key has expired")
    return call_id


def _delta(connection: sa.Connection, chains: sa.Select[Any], record: CallRecord) -> dict[str, Any]:
    """The prompt columns of ``record``: a delta on the longest earlier chain its prompt extends."""
    bounds = {"session_id": record.session_id, "max_length": len(record.prompt_token_ids)}
    rows = connection.execute(chains, bounds).all()
    delta = encode_prompt(record.prompt_token_ids, record.completion_token_ids, [Chain(*row) for row in rows])
    return {
        "prompt_token_ids": delta.token_ids,
        "prompt_parent_id": delta.parent_id,
        "prompt_prefix_len": delta.prefix_len,
        "prompt_len": delta.prompt_len,
        "chain_hash": delta.chain_hash,
    }


@dataclass(frozen=True)
class KeyOwner:
    """The session a proxy key belongs to, its state, and its task's call-limit fields (None: unset)."""

    session_id: uuid.UUID
    state: str
    max_concurrent_calls: int | None
    max_calls: int | None
    timeout_seconds: float | None


def session_state_for_key(db: Database, key_hash: str) -> KeyOwner | None:
    """The session a proxy key belongs to, or None for an unknown key."""
    with db.engine.connect() as connection:
        row = connection.execute(_SESSION_FOR_KEY, {"key_hash": key_hash}).first()
    if row is None:
        return None
    return KeyOwner(row.id, row.state, row.max_concurrent_calls, row.max_calls, row.timeout_seconds)
