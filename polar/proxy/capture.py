"""Persisting a model call. The call's sequence number comes from the session row, claimed in the same
transaction that inserts the call and only while the session is ``running``, so postrun never misses a call
whose answer reached the harness.

This is the proxy's hot path: it uses prebuilt Core statements on a plain connection (the ORM's per-statement
bookkeeping cost ~12 ms a call here; this costs one round trip per statement plus the commit).
"""

from __future__ import annotations

import uuid
from dataclasses import asdict, dataclass
from typing import Any

import sqlalchemy as sa

from polar.errors import SessionNotRunning
from polar.states import State
from polar.storage.database import Database
from polar.storage.models import ModelCall, Session

_sessions = Session.__table__
_NEXT_SEQ = (
    sa.update(_sessions)
    .where(_sessions.c.id == sa.bindparam("session_id"), _sessions.c.state == State.RUNNING.value)
    .values(num_calls=_sessions.c.num_calls + 1)
    .returning(_sessions.c.num_calls)
)
_INSERT = sa.insert(ModelCall.__table__)
_SESSION_FOR_KEY = sa.select(_sessions.c.id, _sessions.c.state).where(
    _sessions.c.proxy_key_hash == sa.bindparam("key_hash")
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


def record_call(db: Database, record: CallRecord) -> uuid.UUID:
    """Store ``record``; raises ``SessionNotRunning`` (and stores nothing) once the session has moved on."""
    call_id = uuid.uuid4()
    with db.engine.begin() as connection:
        seq = connection.execute(_NEXT_SEQ, {"session_id": record.session_id}).scalar()
        if seq is None:
            raise SessionNotRunning("this session is no longer running; its proxy key has expired")
        fields = asdict(record)
        connection.execute(_INSERT, {"id": call_id, "seq": seq, **fields})
    return call_id


def session_state_for_key(db: Database, key_hash: str) -> tuple[uuid.UUID, str] | None:
    """The session a proxy key belongs to and its state, or None for an unknown key."""
    with db.engine.connect() as connection:
        row = connection.execute(_SESSION_FOR_KEY, {"key_hash": key_hash}).first()
    return (row.id, row.state) if row else None
