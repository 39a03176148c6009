"""Cancelling a batch (``POST /v1/batches/<id>/cancel``): sessions that never started end ``cancelled`` at once;
prepared ones (init, ready) go through postrun as cancelled; running ones are stopped by their run worker, whose
heartbeat sees the batch's cancel flag and kills the harness, then postrun recovers what it had captured.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.orm import Session as DbSession

from polar.clock import utcnow
from polar.contract.states import Outcome, State
from polar.errors import NotFound
from polar.lifecycle.admission import admit_after_commit
from polar.lifecycle.attempts import OutcomeClass
from polar.lifecycle.batches import mark_batch_finished
from polar.services import Services
from polar.stages.handoff import send_to_postrun
from polar.storage import db_clock
from polar.storage.models import Batch, Session, SessionEvent
from polar.training.callbacks import record_batch_finished
from polar.training.feed import complete_groups, lock_positions


@dataclass(frozen=True)
class Cancelled:
    batch_id: uuid.UUID
    cancelled: int  # ended at once (had not started)
    stopping: int  # going through postrun (prepared or running)


def _cancel_pending(db: DbSession, services: Services, batch_id: uuid.UUID) -> int:
    """Every pending session of the batch ends ``cancelled`` with its feed position in one UPDATE (one pass over a
    100,000-session batch's rows, not one per concern), its event in one ``INSERT ... SELECT``, and the groups it
    completes get their position: a few statements however many sessions there are."""
    last = lock_positions(db)
    now = db_clock.now(db)
    order = (Session.task_position, Session.sample_index, Session.attempt)
    pending = (
        sa.select(Session.id, sa.func.row_number().over(order_by=order).label("n"))
        .where(Session.batch_id == batch_id, Session.state == State.PENDING.value)
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
    event = (State.PENDING.value, State.CANCELLED.value, services.worker, services.config.node, "batch cancelled")
    columns = ["session_id", "from_state", "to_state", "worker", "node", "detail", "at"]
    cancelled = sa.select(Session.id, *(sa.literal(value) for value in event), now).where(mine)
    db.execute(sa.insert(SessionEvent.__table__).from_select(columns, cancelled))
    complete_groups(db, {row.task_pk for row in rows})
    return len(rows)


def cancel_batch(services: Services, batch_id: uuid.UUID) -> Cancelled:
    with services.db.unit() as db:
        batch = db.get(Batch, batch_id, with_for_update=True)
        if batch is None:
            raise NotFound(f"batch {batch_id} not found")
        if batch.cancel_requested_at is None:
            batch.cancel_requested_at = utcnow()
        cancelled = _cancel_pending(db, services, batch_id)
        if mark_batch_finished(db, batch_id):
            record_batch_finished(db, batch_id)
        prepared = db.execute(
            sa.select(Session.id, Session.state).where(
                Session.batch_id == batch_id, Session.state.in_([State.INIT.value, State.READY.value])
            )
        ).all()
        running = db.scalar(
            sa.select(sa.func.count())
            .select_from(Session)
            .where(Session.batch_id == batch_id, Session.state == State.RUNNING.value)
        )
    stopping = int(running or 0)
    for session_id, state in prepared:
        stopping += send_to_postrun(services, session_id, State(state), Outcome.CANCELLED, "batch cancelled")
    admit_after_commit(services, f"batch {batch_id} is cancelled")
    return Cancelled(batch_id, cancelled, stopping)
