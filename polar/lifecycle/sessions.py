"""Reading sessions and what they captured: the queries behind the rollout API's session endpoints."""

from __future__ import annotations

import re
import uuid
from collections.abc import Collection, Sequence
from typing import Any

import sqlalchemy as sa

from polar.errors import NotFound, ValidationError
from polar.lifecycle.attempts import DEFAULT_MAX_ATTEMPTS
from polar.services import Services
from polar.storage.calls.read import (
    CALL_COLUMNS,
    answered_seconds,
    rebuild,
    routed_experts_of_sessions,
    rows_by_session,
    seqs_after,
    session_rows,
)
from polar.storage.models import Batch, Session, Task, Trajectory
from polar.storage.payloads import PARTS
from polar.storage.serialization import (
    CallJSON,
    CallPageJSON,
    SessionJSON,
    SessionPageJSON,
    TrajectoryJSON,
    call_json,
    session_json,
    time_record,
    trajectory_json,
)


def _max_attempts(spec: dict[str, Any]) -> int:
    return int(spec.get("max_attempts") or DEFAULT_MAX_ATTEMPTS)


def get_session(services: Services, session_id: uuid.UUID) -> SessionJSON:
    with services.db.unit() as db:
        row = db.execute(
            sa.select(Session, Task.spec).join(Task, Task.id == Session.task_pk).where(Session.id == session_id)
        ).first()
        if row is None:
            raise NotFound(f"session {session_id} not found")
        timeout = row[1].get("timeout_seconds") if isinstance(row[1], dict) else None
        found = session_json(row[0], _max_attempts(row[1]))
        found["time"] = time_record(row[0], timeout, answered_seconds(db, session_id))
        return found


def list_sessions(
    services: Services, batch_id: uuid.UUID, limit: int, offset: int = 0, after: str | None = None
) -> SessionPageJSON:
    """A page of a batch's sessions, in task order, then sample order, then attempt (attempts lost to the
    infrastructure are listed too, with ``outcome_class`` and ``retried_as``). ``after`` (a page's ``next_after``)
    reads on from a session by keyset, as fast at the end of a 100,000-session batch as at its start; ``offset``
    counts sessions to skip."""
    key = (Session.task_position, Session.sample_index, Session.attempt)
    with services.db.unit() as db:
        batch = db.get(Batch, batch_id)
        if batch is None:
            raise NotFound(f"batch {batch_id} not found")
        # Every sample's first attempt, plus the retries (few; a partial index holds them).
        retries = sa.select(sa.func.count()).where(Session.batch_id == batch_id, Session.retry_of.is_not(None))
        total = batch.num_sessions + int(db.scalar(retries) or 0)
        query = (
            sa.select(Session, Task.spec)
            .join(Task, Task.id == Session.task_pk)
            .where(Session.batch_id == batch_id)
            .order_by(*key)
            .limit(limit + 1)
        )
        if after is not None:
            query = query.where(sa.tuple_(*key) > sa.tuple_(*parse_cursor(after)))
        fetched = db.execute(query.offset(offset)).all()
        rows = fetched[:limit]
        items = [session_json(session, _max_attempts(spec)) for session, spec in rows]
    last = rows[-1][0] if len(fetched) > limit else None
    next_offset = offset + len(items) if after is None and offset + len(items) < total else None
    return {
        "items": items,
        "total": total,
        "next_offset": next_offset,
        "next_after": f"{last.task_position}.{last.sample_index}.{last.attempt}" if last is not None else None,
    }


_CURSOR = re.compile(r"[0-9]{1,9}\.[0-9]{1,9}\.[0-9]{1,9}")


def parse_cursor(text: str) -> tuple[int, int, int]:
    """A sessions page's ``next_after``: ``<task position>.<sample index>.<attempt>``."""
    # Each part an int4 of the sessions table: ASCII digits, at most 9 of them.
    if not _CURSOR.fullmatch(text):
        raise ValidationError(f"after: expected a page's next_after (like 12.3.1), got {text!r}", field="after")
    position, sample, attempt = (int(part) for part in text.split("."))
    return position, sample, attempt


def _require_session(db: Any, session_id: uuid.UUID) -> None:
    if db.get(Session, session_id) is None:
        raise NotFound(f"session {session_id} not found")


def call_page(services: Services, session_id: uuid.UUID, after: int = 0, limit: int = 100) -> CallPageJSON:
    """The session's calls with ``seq`` above ``after``, at most ``limit``, whole (prompts and payloads rebuilt
    from their deltas); ``next_after`` is the ``after`` of the next page, None on the last one."""
    with services.db.unit() as db:
        _require_session(db, session_id)
        seqs = seqs_after(db, session_id, after, limit + 1)
        page = seqs[:limit]
        if not page:
            return {"items": [], "next_after": None}
        rows = session_rows(db, session_id, up_to_seq=page[-1], columns=CALL_COLUMNS)
    wanted = [row for row in rows if row.seq > after]
    whole = rebuild(rows, {row.id for row in wanted})
    return {
        "items": [call_json(row, whole[row.id]) for row in wanted],
        "next_after": page[-1] if len(seqs) > limit else None,
    }


def session_calls(services: Services, session_id: uuid.UUID) -> list[CallJSON]:
    """Every call of the session, whole, in ``seq`` order (``call_page`` reads them a page at a time)."""
    items: list[CallJSON] = []
    after: int | None = 0
    while after is not None:
        page = call_page(services, session_id, after, limit=1000)
        items += page["items"]
        after = page["next_after"]
    return items


def calls_by_session(services: Services, session_ids: Collection[uuid.UUID]) -> dict[uuid.UUID, list[CallJSON]]:
    """Every call of each of ``session_ids``, whole, in ``seq`` order: ``session_calls`` for many sessions in one
    query (a session without calls, or unknown, gets an empty list)."""
    grouped = stored_calls_by_session(services, session_ids)
    return {session_id: whole_calls(rows) for session_id, rows in grouped.items()}


def stored_calls_by_session(
    services: Services, session_ids: Collection[uuid.UUID], parts: Sequence[str] = PARTS
) -> dict[uuid.UUID, list[Any]]:
    """The stored rows (prompts and the payload ``parts`` as deltas: about one session's tokens once) of each of
    ``session_ids``, in one query; ``whole_calls`` rebuilds one session's calls from them when they are needed."""
    with services.db.unit() as db:
        return rows_by_session(db, session_ids, columns=CALL_COLUMNS, parts=parts)


def whole_calls(rows: Sequence[Any]) -> list[CallJSON]:
    """One session's calls from its stored rows (``stored_calls_by_session``), whole; the payloads the rows were
    read without are None."""
    parts = [part for part in PARTS if part in rows[0]._fields] if rows else list(PARTS)
    whole = rebuild(rows, parts=parts)
    return [call_json(row, whole[row.id]) for row in rows]


def session_trajectories(services: Services, session_id: uuid.UUID) -> list[TrajectoryJSON]:
    with services.db.unit() as db:
        _require_session(db, session_id)
        rows = db.scalars(
            sa.select(Trajectory).where(Trajectory.session_id == session_id).order_by(Trajectory.position)
        ).all()
        routed = routed_experts_of_sessions(db, [session_id])
        return [trajectory_json(row, routed) for row in rows]
