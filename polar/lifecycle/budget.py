"""A harness's budget (``timeout_seconds``) counts only time it had: it starts when the harness starts, not at
init, and the time model calls were held for a weight sync is given back.

    remaining = start_run_budget(services, claimed)     # deadline_at = now + timeout_seconds
    budget = RunBudget(remaining)                       # runtime.exec(..., budget.left, ...)
    budget.update(*budget_left(services, session_id))   # each heartbeat: re-read, paused time not counted
    give_back_pause(db, paused_at, now)                 # on resume: running sessions' deadlines move out

Time a prepared session waits in ``ready`` for a run slot, and time the run worker waits for an engine that is not
answering (``polar.stages.engine_gate``), come before the start and are never charged. While calls are paused
(``engine_control.paused_at`` set), a running session's remaining budget is frozen; at resume the pause's length
(from the later of its start and the session's run start) is added to ``deadline_at``. All on the database's clock.
"""

from __future__ import annotations

import threading
import time
import uuid
from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.orm import Session as DbSession

from polar.clock import as_utc
from polar.lifecycle.states import State
from polar.services import Services
from polar.storage import db_clock
from polar.storage.models import EngineControl, Session


def start_run_budget(services: Services, session_id: uuid.UUID, held: sa.ColumnElement[bool], timeout_s: float) -> None:
    """The harness is about to start: its whole budget from now (while the caller's lease ``held`` holds)."""
    with services.db.unit() as db:
        db.execute(
            sa.update(Session).where(Session.id == session_id, held).values(deadline_at=db_clock.shifted(db, timeout_s))
        )


def _db_now(db: DbSession) -> datetime:
    now = as_utc(db.scalar(sa.select(db_clock.now(db))))
    assert now is not None
    return now


def budget_left(services: Services, session_id: uuid.UUID) -> tuple[float, bool]:
    """(seconds of budget left, whether calls are paused now): the paused time so far is not counted."""
    with services.db.unit() as db:
        now = _db_now(db)
        row = db.execute(sa.select(Session.deadline_at, Session.run_started_at).where(Session.id == session_id)).one()
        control = db.execute(sa.select(EngineControl.paused, EngineControl.paused_at)).first()
    deadline, started = as_utc(row.deadline_at), as_utc(row.run_started_at)
    assert deadline is not None
    left = (deadline - now).total_seconds()
    paused = control is not None and control.paused and control.paused_at is not None
    if paused:
        left += _credit(as_utc(control.paused_at), started, now).total_seconds()  # type: ignore[union-attr]
    return left, paused


def _credit(paused_at: datetime | None, run_started: datetime | None, now: datetime) -> timedelta:
    """How much of a pause a session ran through: from the later of the pause's and the run's start until now."""
    assert paused_at is not None
    since = max(paused_at, run_started) if run_started is not None else paused_at
    return max(timedelta(0), now - since)


def give_back_pause(db: DbSession, paused_at: datetime, now: datetime) -> int:
    """Inside the resume's transaction: every running session's deadline moves out by the part of the pause it ran
    through; returns how many moved. A deadline changed meanwhile (the run just started its budget) is left."""
    rows = db.execute(
        sa.select(Session.id, Session.deadline_at, Session.run_started_at).where(
            Session.state == State.RUNNING.value, Session.deadline_at.is_not(None)
        )
    ).all()
    moved = 0
    for row in rows:
        credit = _credit(as_utc(paused_at), as_utc(row.run_started_at), as_utc(now))  # type: ignore[arg-type]
        if credit <= timedelta(0):
            continue
        deadline = as_utc(row.deadline_at)
        assert deadline is not None
        moved += db.execute(
            sa.update(Session)
            .where(Session.id == row.id, Session.deadline_at == row.deadline_at)
            .values(deadline_at=deadline + credit)
        ).rowcount
    return moved


class RunBudget:
    """A running harness's budget in this process: the seconds left when last read from the database, counted
    down on this process's clock (not while calls are paused) until the next read."""

    def __init__(self, left_s: float) -> None:
        self._lock = threading.Lock()
        self._left_s, self._paused, self._read = left_s, False, time.monotonic()

    def update(self, left_s: float, paused: bool) -> None:
        with self._lock:
            self._left_s, self._paused, self._read = left_s, paused, time.monotonic()

    def left(self) -> float:
        with self._lock:
            return self._left_s if self._paused else self._left_s - (time.monotonic() - self._read)
