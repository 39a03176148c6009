"""Reading sessions and what they captured: the queries behind the rollout API's session endpoints."""

from __future__ import annotations

import uuid
from typing import Any

import sqlalchemy as sa

from polar.errors import NotFound
from polar.lifecycle.attempts import DEFAULT_MAX_ATTEMPTS
from polar.serialization import (
    CallJSON,
    SessionJSON,
    SessionPageJSON,
    TrajectoryJSON,
    call_json,
    session_json,
    trajectory_json,
)
from polar.services import Services
from polar.storage.models import Batch, ModelCall, Session, Task, Trajectory
from polar.storage.prompts import full_prompts


def _max_attempts(spec: dict[str, Any]) -> int:
    return int(spec.get("max_attempts") or DEFAULT_MAX_ATTEMPTS)


def get_session(services: Services, session_id: uuid.UUID) -> SessionJSON:
    with services.db.unit() as db:
        row = db.execute(
            sa.select(Session, Task.spec).join(Task, Task.id == Session.task_pk).where(Session.id == session_id)
        ).first()
        if row is None:
            raise NotFound(f"session {session_id} not found")
        return session_json(row[0], _max_attempts(row[1]))


def list_sessions(services: Services, batch_id: uuid.UUID, limit: int, offset: int) -> SessionPageJSON:
    """A page of a batch's sessions, in task order, then sample order, then attempt (attempts lost to the
    infrastructure are listed too, with ``outcome_class`` and ``retried_as``)."""
    with services.db.unit() as db:
        if db.get(Batch, batch_id) is None:
            raise NotFound(f"batch {batch_id} not found")
        total = int(db.scalar(sa.select(sa.func.count()).select_from(Session).where(Session.batch_id == batch_id)) or 0)
        rows = db.execute(
            sa.select(Session, Task.spec)
            .join(Task, Task.id == Session.task_pk)
            .where(Session.batch_id == batch_id)
            .order_by(Task.position, Session.sample_index, Session.attempt)
            .limit(limit)
            .offset(offset)
        ).all()
        items = [session_json(session, _max_attempts(spec)) for session, spec in rows]
    next_offset = offset + len(items)
    return {"items": items, "total": total, "next_offset": next_offset if next_offset < total else None}


def _require_session(db: Any, session_id: uuid.UUID) -> None:
    if db.get(Session, session_id) is None:
        raise NotFound(f"session {session_id} not found")


def session_calls(services: Services, session_id: uuid.UUID) -> list[CallJSON]:
    with services.db.unit() as db:
        _require_session(db, session_id)
        rows = db.scalars(sa.select(ModelCall).where(ModelCall.session_id == session_id).order_by(ModelCall.seq)).all()
        prompts = full_prompts(rows)
        return [call_json(row, prompts[row.id]) for row in rows]


def session_trajectories(services: Services, session_id: uuid.UUID) -> list[TrajectoryJSON]:
    with services.db.unit() as db:
        _require_session(db, session_id)
        rows = db.scalars(
            sa.select(Trajectory).where(Trajectory.session_id == session_id).order_by(Trajectory.position)
        )
        return [trajectory_json(row) for row in rows]
