"""The bounded READY buffer (DESIGN.md §2): admit pending sessions into ``init`` while init + ready < bound.

The bound is the sum of the live nodes' own READY bounds (``polar.lifecycle.nodes``); each init worker then
takes a session only while its node has room, so every node holds at most its own bound. Admission runs under
a database lock so concurrent admitters (the API after a submit, run workers as sessions leave ``ready``, the
reconciler, init workers checking their node) never overshoot together. Init messages are recorded as due in the
same transaction (``polar.lifecycle.outbox``) and sent after it commits.

Higher ``priority`` (a task's, 0-100, default 50) goes first; within one priority, later attempts of samples lost
to the infrastructure (their GRPO groups are waiting on them), then the oldest. Sessions already admitted are never
preempted. The order is one partial index's (``ix_sessions_pending_admission``, migration 0024): a pass reads the
``room`` rows it admits, not every pending session (audit G14).
"""

from __future__ import annotations

import logging
import uuid

import sqlalchemy as sa

from polar.contract.dispatch import Stage
from polar.contract.states import BUFFERED, State
from polar.errors import PolarError
from polar.lifecycle.nodes import ready_capacity
from polar.lifecycle.outbox import send_due
from polar.lifecycle.transitions import transition_all
from polar.services import Services
from polar.storage.locks import ADMISSION, exclusive
from polar.storage.models import Session

log = logging.getLogger(__name__)


# The index migration 0024 builds for it has these columns in this order.
ADMISSION_ORDER = (Session.priority.desc(), Session.attempt.desc(), Session.created_at, Session.batch_id,
                   Session.task_position, Session.sample_index)  # fmt: skip


def admit(services: Services) -> list[uuid.UUID]:
    """Admit as many pending sessions (highest priority, then oldest first) as the READY buffer has room for;
    returns their ids."""
    admitted: list[uuid.UUID] = []
    with services.db.unit() as db:
        exclusive(db, ADMISSION)
        occupied = db.scalar(
            sa.select(sa.func.count()).select_from(Session).where(Session.state.in_([s.value for s in BUFFERED]))
        )
        capacity = ready_capacity(db, services.config.stale_after_s, services.config.ready_buffer)
        room = capacity - int(occupied or 0)
        if room <= 0:
            return []
        candidates = db.scalars(
            sa.select(Session.id).where(Session.state == State.PENDING.value).order_by(*ADMISSION_ORDER).limit(room)
        ).all()
        admitted = transition_all(db, candidates, State.PENDING, State.INIT, by=services, detail="admitted",
                                  due=Stage.INIT)  # fmt: skip
    send_due(services, admitted)  # what the broker does not take now stays due: the reconciler sends it
    return admitted


def admit_after_commit(services: Services, what: str) -> None:
    """:func:`admit` after a change that has committed (a batch stored, sessions cancelled): best effort, since
    the change stands whatever admission does, and a caller told it failed would repeat it. The reconciler admits
    what this could not."""
    try:
        admit(services)
    except (PolarError, sa.exc.SQLAlchemyError) as exc:
        log.warning("%s; admitting pending sessions failed, the reconciler will: %s", what, exc)
