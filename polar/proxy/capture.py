"""Persisting a model call. The call's sequence number comes from the session row, claimed in the same
transaction that inserts the call and only while the session is ``running``, so postrun never misses a call
whose answer reached the harness."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from polar.errors import SessionNotRunning
from polar.states import State
from polar.storage.database import Database
from polar.storage.models import ModelCall, Session


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
    with db.unit() as session:
        seq = session.scalar(
            sa.update(Session)
            .where(Session.id == record.session_id, Session.state == State.RUNNING.value)
            .values(num_calls=Session.num_calls + 1)
            .returning(Session.num_calls)
        )
        if seq is None:
            raise SessionNotRunning("this session is no longer running; its proxy key has expired")
        session.execute(
            sa.insert(ModelCall).values(
                id=call_id,
                seq=seq,
                **{name: getattr(record, name) for name in record.__dataclass_fields__},
            )
        )
    return call_id
