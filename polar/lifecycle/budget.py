"""A harness's budget (``timeout_seconds``) counts only time it had: it starts when the harness starts, not at
init, and the time a weight-sync pause held the harness's model calls is given back.

    start_run_budget(services, session_id, held, timeout_s)  # deadline_at = now + timeout_s; budget_started_at = now
    budget = RunBudget(timeout_s)                       # runtime.exec(..., budget.left, ...)
    budget.update(*budget_left(services, session_id))   # each heartbeat: re-read, held time not counted
    give_back_pause(db, paused_at, now, cap_s)          # on resume: held sessions' deadlines move out

Time a prepared session waits in ``ready`` for a run slot, and time the run worker waits for an engine that is not
answering (``polar.stages.engine_gate``), come before the start and are never charged.

A pause charges what it holds. While calls are paused (``engine_control.paused_at`` set), a harness keeps working
(builds, tests) until it asks for the model; the proxy notes the first call of this pause it refused or held
(``sessions.pause_held_at``, ``polar.proxy.pause_holds``). From then on the session's remaining budget stands
still; at resume the held time, ``now - max(pause_held_at, paused_at, budget_started_at)``, is added to its
``deadline_at``, at most ``cap_s`` (``POLAR_MAX_PAUSE``) for one pause, and every session's hold is cleared. A
session that worked through the pause without a call refused or held is charged all of it. A hold older than the
pause's start is a previous pause's and counts for nothing. All on the database's clock.
"""

from __future__ import annotations

import threading
import time
import uuid
from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.orm import Session as DbSession

from polar.clock import as_utc
from polar.contract.states import State
from polar.services import Services
from polar.storage import db_clock
from polar.storage.models import EngineControl, Session


def start_run_budget(services: Services, session_id: uuid.UUID, held: sa.ColumnElement[bool], timeout_s: float) -> None:
    """The harness is about to start: its whole budget from now (while the caller's lease ``held`` holds)."""
    with services.db.unit() as db:
        now = db_clock.now(db)
        db.execute(
            sa.update(Session)
            .where(Session.id == session_id, held)
            .values(deadline_at=db_clock.shifted(db, timeout_s), budget_started_at=now, pause_held_at=None)
        )


def _db_now(db: DbSession) -> datetime:
    now = as_utc(db.scalar(sa.select(db_clock.now(db))))
    assert now is not None
    return now


def held_since(paused_at: datetime | None, held_at: datetime | None, started: datetime | None) -> datetime | None:
    """Since when this pause has held the session (None: it has not): the later of its first refused or held
    call, the pause's start and the budget's start. A hold from before the pause began was a previous pause's."""
    if paused_at is None or held_at is None or held_at < paused_at:
        return None
    return max(held_at, paused_at, started) if started is not None else max(held_at, paused_at)


def credit(since: datetime | None, now: datetime, cap_s: float) -> timedelta:
    """The budget a pause gives back: the time it held the session, at most ``cap_s``."""
    if since is None:
        return timedelta(0)
    return min(timedelta(seconds=cap_s), max(timedelta(0), now - since))


def budget_left(services: Services, session_id: uuid.UUID) -> tuple[float, bool]:
    """(seconds of budget left, whether it stands still now: a pause holds the session's calls and has not yet
    given it ``POLAR_MAX_PAUSE``): the held time so far is not counted."""
    cap_s = services.config.max_pause_s
    with services.db.unit() as db:
        now = _db_now(db)
        row = db.execute(
            sa.select(Session.deadline_at, Session.budget_started_at, Session.pause_held_at).where(
                Session.id == session_id
            )
        ).one()
        control = db.execute(sa.select(EngineControl.paused, EngineControl.paused_at)).first()
    deadline = as_utc(row.deadline_at)
    assert deadline is not None
    paused_at = as_utc(control.paused_at) if control is not None and control.paused else None
    since = held_since(paused_at, as_utc(row.pause_held_at), as_utc(row.budget_started_at))
    given = credit(since, now, cap_s)
    frozen = since is not None and given < timedelta(seconds=cap_s)
    return (deadline - now + given).total_seconds(), frozen


def give_back_pause(db: DbSession, paused_at: datetime, now: datetime, cap_s: float) -> int:
    """Inside the resume's transaction: every running session the pause held gets its held time back (at most
    ``cap_s``) on its deadline, and every session's hold is cleared; returns how many deadlines moved. A deadline
    changed meanwhile (the run just started its budget) is left."""
    rows = db.execute(
        sa.select(Session.id, Session.deadline_at, Session.budget_started_at, Session.pause_held_at).where(
            Session.state == State.RUNNING.value,
            Session.deadline_at.is_not(None),
            Session.pause_held_at.is_not(None),
        )
    ).all()
    moved = 0
    for row in rows:
        since = held_since(as_utc(paused_at), as_utc(row.pause_held_at), as_utc(row.budget_started_at))
        given = credit(since, as_utc(now), cap_s)  # type: ignore[arg-type]
        if given <= timedelta(0):
            continue
        deadline = as_utc(row.deadline_at)
        assert deadline is not None
        moved += db.execute(
            sa.update(Session)
            .where(Session.id == row.id, Session.deadline_at == row.deadline_at)
            .values(deadline_at=deadline + given)
        ).rowcount
    db.execute(sa.update(Session).where(Session.pause_held_at.is_not(None)).values(pause_held_at=None))
    return moved


class RunBudget:
    """A running harness's budget in this process: the seconds left when last read from the database, counted
    down on this process's clock (not while a pause holds its calls) until the next read."""

    def __init__(self, left_s: float) -> None:
        self._lock = threading.Lock()
        self._left_s, self._frozen, self._read = left_s, False, time.monotonic()

    def update(self, left_s: float, frozen: bool) -> None:
        with self._lock:
            self._left_s, self._frozen, self._read = left_s, frozen, time.monotonic()

    def left(self) -> float:
        with self._lock:
            return self._left_s if self._frozen else self._left_s - (time.monotonic() - self._read)
