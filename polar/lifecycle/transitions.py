"""Session state changes: every one is a compare-and-set on the session row plus a ``session_events`` row.

A redelivered Celery message therefore changes nothing: its compare-and-set finds the row already moved on. A
stage that holds the session passes its lease token (``where=[Session.lease == token]``), so a stale holder (a
worker that stalled and lost its lease to another) changes nothing either. Times come from the database's clock.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session as DbSession

from polar.codec.json_body import storable_text
from polar.contract.dispatch import Stage
from polar.contract.states import ALLOWED, TERMINAL, State
from polar.lifecycle.outbox import due as make_due
from polar.services import Services
from polar.storage import db_clock
from polar.storage.models import Session, SessionEvent

_STAMP = {
    State.INIT: None,
    State.READY: "ready_at",
    State.RUNNING: "run_started_at",
    State.POSTRUN: "postrun_started_at",
}


def transition(
    db: DbSession,
    session_id: uuid.UUID,
    expected: State | Iterable[State],
    new: State,
    *,
    by: Services,
    detail: str | None = None,
    where: Iterable[sa.ColumnElement[bool]] = (),
    due: Stage | None = None,
    pinned: bool = True,
    **fields: Any,
) -> bool:
    """Move ``session_id`` from one of ``expected`` to ``new`` if it is still there; True when it moved.

    ``fields`` are set in the same UPDATE; ``where`` adds conditions (a lease token, a stale heartbeat); ``due``
    records the stage message the move makes due (``polar.lifecycle.outbox``; ``pinned=False``: on the shared
    queue), to be sent after the commit. The caller's transaction commits the row, its event and what is due
    together; the row and the event name ``by``'s worker, the event its node. The lease is released.
    """
    expected_set = {expected} if isinstance(expected, State) else set(expected)
    for state in expected_set:
        if new not in ALLOWED.get(state, frozenset()):
            raise ValueError(f"transition {state} -> {new} is not allowed")
    now = db_clock.now(db)
    values: dict[str, Any] = {"state": new.value, "heartbeat_at": None, "lease": None, "worker": by.worker}
    if due is not None:
        values.update(make_due(db, due, pinned))
    values.update(fields)
    stamp = _STAMP.get(new)
    if stamp and stamp not in values:
        values[stamp] = now
    if new in TERMINAL:
        values.setdefault("finished_at", now)
    conditions = list(where)
    # One compare-and-set per expected state, so the event records the state the row really left.
    for state in expected_set:
        result = db.execute(
            sa.update(Session)
            .where(Session.id == session_id, Session.state == state.value, *conditions)
            .values(**values)
            .returning(Session.id)
        )
        if result.first() is not None:
            record_event(db, session_id, state, new, by, detail)
            return True
    return False


def transition_all(
    db: DbSession,
    session_ids: Iterable[uuid.UUID],
    expected: State,
    new: State,
    *,
    by: Services,
    detail: str | None = None,
    due: Stage | None = None,
) -> list[uuid.UUID]:
    """:func:`transition` for many sessions in one UPDATE and one INSERT of their events (admission moves a READY
    buffer's room of them at once): those still in ``expected`` move, and are returned in the order given."""
    ids = list(session_ids)
    if not ids:
        return []
    if new not in ALLOWED.get(expected, frozenset()) or new in TERMINAL or _STAMP.get(new):
        raise ValueError(f"transition_all {expected} -> {new} is not supported")
    values: dict[str, Any] = {"state": new.value, "heartbeat_at": None, "lease": None, "worker": by.worker}
    if due is not None:
        values.update(make_due(db, due, True))
    changed = set(db.scalars(
        sa.update(Session).where(Session.id.in_(ids), Session.state == expected.value).values(**values)
        .returning(Session.id)
    ))  # fmt: skip
    moved = [session_id for session_id in ids if session_id in changed]  # in the order given (admission's)
    if moved:
        text = storable_text(detail) if detail is not None else None
        columns = ["session_id", "from_state", "to_state", "at", "worker", "node", "detail"]
        events = sa.select(
            Session.id, sa.literal(expected.value), sa.literal(new.value), db_clock.now(db), sa.literal(by.worker),
            sa.literal(by.config.node, sa.Text), sa.literal(text, sa.Text),
        ).where(Session.id.in_(moved))  # fmt: skip
        db.execute(sa.insert(SessionEvent.__table__).from_select(columns, events))
    return moved


def record_event(
    db: DbSession,
    session_id: uuid.UUID,
    from_state: State | None,
    to_state: State,
    by: Services,
    detail: str | None,
    at: datetime | sa.ColumnElement[datetime] | None = None,
) -> None:
    db.add(
        SessionEvent(
            session_id=session_id,
            from_state=from_state.value if from_state else None,
            to_state=to_state.value,
            at=at if at is not None else db_clock.now(db),
            worker=by.worker,
            node=by.config.node,
            detail=storable_text(detail) if detail is not None else None,  # it may quote a harness's output
        )
    )
