"""Early stop per group (a task's ``early_stop: {"min_usable": N}``): once N samples of the group have settled with a
task outcome, the group's stragglers are not waited for.

Decided in postrun's terminal transaction of the N-th usable sample: the task is stamped ``stopped_at``, its
unstarted samples end ``cancelled`` at once, and the ones already admitted see the stamp as they would a batch
cancel (a run's heartbeat kills the harness; a run not yet started does not start it; none is retried) and end
``cancelled`` too. Cancelled samples are never scored or served; the group completes once they have ended, with its
usable samples, and the feed says so (``group_scored``, ``group_missing``).
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.orm import Session as DbSession

from polar.lifecycle.attempts import OutcomeClass
from polar.services import Services
from polar.stages.unstarted import cancel_unstarted
from polar.storage import db_clock
from polar.storage.models import Session, Task


def stop_if_enough(db: DbSession, services: Services, session: Session, min_usable: int) -> bool:
    """After ``session`` settled with a task outcome: stop its group if it has ``min_usable`` usable samples and
    was not stopped yet (True then)."""
    usable = db.scalar(
        sa.select(sa.func.count()).where(
            Session.task_pk == session.task_pk,
            Session.outcome_class == OutcomeClass.TASK.value,
            Session.retried_as.is_(None),
        )
    )
    if int(usable or 0) < min_usable:
        return False
    stamped = db.execute(
        sa.update(Task)
        .where(Task.id == session.task_pk, Task.stopped_at.is_(None))
        .values(stopped_at=db_clock.now(db))
        .returning(Task.id)
    ).first()
    if stamped is None:
        return False  # an earlier sample stopped it
    cancel_unstarted(db, services, session.batch_id, f"group stopped early: {min_usable} usable samples",
                     session.task_pk)  # fmt: skip
    return True
