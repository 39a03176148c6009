"""Cancelling a batch (``POST /v1/batches/<id>/cancel``): sessions that never started end ``cancelled`` at once;
prepared ones (init, ready) go through postrun as cancelled; running ones are stopped by their run worker, whose
heartbeat sees the batch's cancel flag and kills the harness, then postrun recovers what it had captured.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import sqlalchemy as sa

from polar.clock import utcnow
from polar.errors import NotFound
from polar.lifecycle.admission import admit
from polar.lifecycle.attempts import OutcomeClass
from polar.lifecycle.batches import mark_batch_finished
from polar.lifecycle.states import Outcome, State
from polar.lifecycle.transitions import transition
from polar.services import Services
from polar.stages.handoff import send_to_postrun
from polar.storage.models import Batch, Session
from polar.training.feed import assign_position


@dataclass(frozen=True)
class Cancelled:
    batch_id: uuid.UUID
    cancelled: int  # ended at once (had not started)
    stopping: int  # going through postrun (prepared or running)


def cancel_batch(services: Services, batch_id: uuid.UUID) -> Cancelled:
    with services.db.unit() as db:
        batch = db.get(Batch, batch_id, with_for_update=True)
        if batch is None:
            raise NotFound(f"batch {batch_id} not found")
        if batch.cancel_requested_at is None:
            batch.cancel_requested_at = utcnow()
        pending = db.scalars(
            sa.select(Session.id).where(Session.batch_id == batch_id, Session.state == State.PENDING.value)
        ).all()
        cancelled = 0
        for session_id in pending:
            if transition(
                db,
                session_id,
                State.PENDING,
                State.CANCELLED,
                by=services,
                detail="batch cancelled",
                outcome=Outcome.CANCELLED.value,
                outcome_class=OutcomeClass.TASK.value,
            ):
                assign_position(db, session_id)
                cancelled += 1
        mark_batch_finished(db, batch_id)
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
