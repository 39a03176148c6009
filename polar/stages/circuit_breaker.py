"""A batch's circuit breaker (``max_consecutive_infra_losses``): after that many attempts in a row lost to the
infrastructure (a runtime that cannot start, an engine that keeps failing the harness's calls), the batch stops
admitting instead of burning every sample's attempts on the same fault.

Counted in postrun's terminal transaction: an attempt lost to the infrastructure adds one to the batch's streak, one
with a task outcome (the model acted, whatever it scored) resets it; excluded and cancelled attempts leave it. When
the streak reaches the bound the batch is halted: ``halted_at`` and ``halted_reason`` are set (the batch's status,
the console and ``polar_batches_halted`` say so), its unstarted sessions end ``cancelled`` at once (class
``cancelled``: never scored, never served) and the sessions already past admission finish as they would. Only a
batch with a bound touches its row here.
"""

from __future__ import annotations

import uuid

import sqlalchemy as sa
from sqlalchemy.orm import Session as DbSession

from polar.lifecycle.attempts import OutcomeClass
from polar.services import Services
from polar.stages.unstarted import cancel_unstarted
from polar.storage import db_clock
from polar.storage.models import Batch


def count_attempt(db: DbSession, services: Services, batch_id: uuid.UUID, outcome_class: OutcomeClass,
                  outcome: str) -> bool:  # fmt: skip
    """Count one settled attempt toward the batch's streak; True when this one halted the batch."""
    if outcome_class not in (OutcomeClass.INFRASTRUCTURE, OutcomeClass.TASK):
        return False
    lost = outcome_class is OutcomeClass.INFRASTRUCTURE
    streak = Batch.infra_loss_streak + 1 if lost else sa.literal(0)
    row = db.execute(
        sa.update(Batch)
        .where(Batch.id == batch_id, Batch.max_consecutive_infra_losses.is_not(None), Batch.halted_at.is_(None))
        .values(infra_loss_streak=streak)
        .returning(Batch.infra_loss_streak, Batch.max_consecutive_infra_losses)
    ).first()
    if row is None or not lost or row.infra_loss_streak < row.max_consecutive_infra_losses:
        return False
    reason = (f"stopped admitting: {row.infra_loss_streak} attempts in a row were lost to the infrastructure "
              f"(max_consecutive_infra_losses {row.max_consecutive_infra_losses}; the last: {outcome})")  # fmt: skip
    db.execute(sa.update(Batch).where(Batch.id == batch_id).values(halted_at=db_clock.now(db), halted_reason=reason))
    cancel_unstarted(db, services, batch_id, f"batch halted: {reason}")
    return True
