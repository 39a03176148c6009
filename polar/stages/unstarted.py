"""Ending a batch's unstarted sessions ``cancelled`` at once: a cancel (``polar.batches.cancel``) and a batch's
circuit breaker (``polar.stages.circuit_breaker``) both do."""

from __future__ import annotations

import uuid

import sqlalchemy as sa
from sqlalchemy.orm import Session as DbSession

from polar.contract.states import Outcome, State
from polar.lifecycle.attempts import OutcomeClass
from polar.services import Services
from polar.storage import db_clock
from polar.storage.models import Session, SessionEvent
from polar.training.feed import complete_groups, lock_positions


def cancel_unstarted(
    db: DbSession, services: Services, batch_id: uuid.UUID, detail: str, task_pk: uuid.UUID | None = None
) -> int:
    """Every pending session of the batch (of its task ``task_pk``, when given) ends ``cancelled`` (its event saying
    ``detail``) with its feed position in one UPDATE (one pass over a 100,000-session batch's rows, not one per
    concern), its event in one ``INSERT ... SELECT``, and the groups it completes get their position: a few
    statements however many sessions there are."""
    last = lock_positions(db)
    now = db_clock.now(db)
    order = (Session.task_position, Session.sample_index, Session.attempt)
    pending = (
        sa.select(Session.id, sa.func.row_number().over(order_by=order).label("n"))
        .where(
            Session.batch_id == batch_id,
            Session.state == State.PENDING.value,
            *([Session.task_pk == task_pk] if task_pk is not None else []),
        )
        .subquery("pending")
    )
    rows = db.execute(
        sa.update(Session)
        .where(Session.id == pending.c.id)
        .values(
            state=State.CANCELLED.value, outcome=Outcome.CANCELLED.value, outcome_class=OutcomeClass.CANCELLED.value,
            finished_at=now, heartbeat_at=None, lease=None, worker=services.worker, feed_seq=last + pending.c.n,
        )
        .returning(Session.task_pk)
    ).all()  # fmt: skip
    if not rows:
        return 0
    # Positions above ``last`` were handed out in this transaction, under the feed lock: these sessions' alone.
    mine = sa.and_(Session.batch_id == batch_id, Session.feed_seq > last)
    event = (State.PENDING.value, State.CANCELLED.value, services.worker, services.config.node, detail)
    columns = ["session_id", "from_state", "to_state", "worker", "node", "detail", "at"]
    cancelled = sa.select(Session.id, *(sa.literal(value) for value in event), now).where(mine)
    db.execute(sa.insert(SessionEvent.__table__).from_select(columns, cancelled))
    complete_groups(db, {row.task_pk for row in rows})
    return len(rows)
