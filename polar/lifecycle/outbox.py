"""The stage outbox: a stage message is recorded as *due* on the session row in the same transaction as the state
change that makes it due, and sent after that transaction commits. A broker that is down (or fails halfway through
a thousand admissions) therefore loses nothing: the row says what is due and unsent, and the reconciler sends it.

    transition(db, session_id, State.PENDING, State.INIT, by=services, due=Stage.INIT)   # inside a transaction
    send_due(services, [session_id])                                                      # after the commit

``due_node`` is the node whose queue takes the message (``run.<node>``), decided when it becomes due: the
session's own node for the stages after init, or none (the shared queue) for init and for a lost node's postrun.
``stage_enqueued_at`` is stamped once the broker took the message.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session as DbSession

from polar.contract.dispatch import Stage
from polar.contract.states import State
from polar.errors import BrokerUnavailable
from polar.services import Services
from polar.storage import db_clock
from polar.storage.models import Session

log = logging.getLogger(__name__)

_SESSIONS = Session.__table__

# The state a session is in while each stage's message is due (run is due while the session waits in ready).
STATE_WHILE_DUE = {
    Stage.INIT: State.INIT,
    Stage.READY: State.READY,
    Stage.RUN: State.READY,
    Stage.POSTRUN: State.POSTRUN,
}


def due(db: Any, stage: Stage, pinned: bool = True) -> dict[str, Any]:
    """Column values that make ``stage`` due, for the UPDATE of the state change (or on their own)."""
    return {
        "due_stage": stage.value,
        "due_node": Session.node if pinned and stage is not Stage.INIT else None,
        "due_at": db_clock.now(db),
        "stage_enqueued_at": None,
    }


def send_due(services: Services, session_ids: Iterable[uuid.UUID]) -> int:
    """Send the due, unsent stage messages of these sessions; returns how many went. At the first broker failure
    it stops (each try can take a second): the rest stay due, and the reconciler sends them."""
    ids = list(session_ids)
    if not ids:
        return 0
    with services.db.unit() as db:
        rows = db.execute(
            sa.select(Session.id, Session.due_stage, Session.due_node, Session.due_at).where(
                Session.id.in_(ids), Session.due_stage.is_not(None), Session.stage_enqueued_at.is_(None)
            )
        ).all()
    # In the order given (admission's oldest first): the query returns rows in whatever order the table holds them.
    position = {session_id: index for index, session_id in enumerate(ids)}
    rows = sorted(rows, key=lambda row: position[row.id])
    sent: list[dict[str, Any]] = []
    try:
        for row in rows:
            services.dispatcher.send(Stage(row.due_stage), row.id, row.due_node)
            sent.append({"sid": row.id, "due": row.due_at})
    except BrokerUnavailable as exc:
        log.warning(
            "broker unavailable (%s): %d stage message(s) left due for the reconciler", exc, len(rows) - len(sent)
        )
    if sent:
        with services.db.unit() as db:
            # Only the due we read: a newer one (the session moved on meanwhile) is not marked sent by us.
            db.execute(
                sa.update(_SESSIONS)
                .where(
                    _SESSIONS.c.id == sa.bindparam("sid"),
                    _SESSIONS.c.due_at == sa.bindparam("due"),
                    _SESSIONS.c.stage_enqueued_at.is_(None),
                )
                .values(stage_enqueued_at=db_clock.now(db)),
                sent,
            )
    return len(sent)


def dispatch(services: Services, stage: Stage, session_id: uuid.UUID, *, pinned: bool = True) -> None:
    """Make ``stage`` due for a session whose state change is already committed (a re-send, ready's run
    message), and send it."""
    with services.db.unit() as db:
        db.execute(sa.update(Session).where(Session.id == session_id).values(**due(db, stage, pinned)))
    send_due(services, [session_id])


def unsent(db: DbSession, older_than_s: float, limit: int = 1000) -> list[uuid.UUID]:
    """Sessions whose due message has not gone out for ``older_than_s`` (the sender died or the broker failed),
    still in the state that message is for."""
    still_due = sa.or_(
        *(
            sa.and_(Session.due_stage == stage.value, Session.state == state.value)
            for stage, state in STATE_WHILE_DUE.items()
        )
    )
    return list(
        db.scalars(
            sa.select(Session.id)
            .where(
                Session.due_stage.is_not(None),
                Session.stage_enqueued_at.is_(None),
                Session.due_at < db_clock.ago(db, older_than_s),
                still_due,
            )
            .order_by(Session.due_at)
            .limit(limit)
        )
    )
