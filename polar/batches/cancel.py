"""Cancelling a batch (``POST /v1/batches/<id>/cancel``): sessions that never started end ``cancelled`` at once;
prepared ones (init, ready) go through postrun as cancelled; running ones are stopped by their run worker, whose
heartbeat sees the batch's cancel flag and kills the harness, then postrun recovers what it had captured.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import sqlalchemy as sa

from polar.clock import utcnow
from polar.contract.states import Outcome, State
from polar.errors import NotFound
from polar.lifecycle.admission import admit_after_commit
from polar.lifecycle.batches import mark_batch_finished
from polar.services import Services
from polar.stages.handoff import send_to_postrun
from polar.stages.unstarted import cancel_unstarted
from polar.storage.models import Batch, Session
from polar.training.callbacks import record_batch_finished


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
        cancelled = cancel_unstarted(db, services, batch_id, "batch cancelled")
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
