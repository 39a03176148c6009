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
from polar.errors import NotFound
from polar.lifecycle.admission import admit
from polar.lifecycle.attempts import OutcomeClass
from polar.lifecycle.batches import mark_batch_finished
from polar.lifecycle.states import Outcome, State
from polar.services import Services
from polar.stages.handoff import send_to_postrun
from polar.storage import db_clock
from polar.storage.models import Batch, Session, SessionEvent
from polar.training.callbacks import record_batch_finished
from polar.training.feed import assign_positions


@dataclass(frozen=True)
class Cancelled:
    batch_id: uuid.UUID
    cancelled: int  # ended at once (had not started)
    stopping: int  # going through postrun (prepared or running)


def _cancel_pending(db: DbSession, services: Services, batch_id: uuid.UUID) -> int:
    """Every pending session of the batch ends ``cancelled`` in a few statements (one UPDATE, one batched insert
    of events, one batched feed assignment), however many there are."""
    now = db_clock.now(db)
    ids = db.scalars(
        sa.update(Session)
        .where(Session.batch_id == batch_id, Session.state == State.PENDING.value)
        .values(
            state=State.CANCELLED.value, outcome=Outcome.CANCELLED.value, outcome_class=OutcomeClass.TASK.value,
            finished_at=now, heartbeat_at=None, lease=None, worker=services.worker,
        )
        .returning(Session.id)
    ).all()  # fmt: skip
    if not ids:
        return 0
    event = {"from_state": State.PENDING.value, "to_state": State.CANCELLED.value, "worker": services.worker,
             "node": services.config.node, "detail": "batch cancelled"}  # fmt: skip
    db.execute(sa.insert(SessionEvent.__table__).values(at=now), [{"session_id": i, **event} for i in ids])
    assign_positions(db, ids)
    return len(ids)


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
    admit(services)
    return Cancelled(batch_id, cancelled, stopping)
