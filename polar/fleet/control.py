"""Holding model calls while a trainer syncs weights (``POST /v1/engine/pause`` / ``resume``), and the policy
version every captured call is stamped with. The time a pause held a harness's calls is given back to its budget
(``polar.lifecycle.budget``), and a pause held longer than ``POLAR_MAX_PAUSE`` is ended by the reconciler
(``expire_pause``, ``polar.training.pause_limit``).

The state is one row in the database. Proxies re-read it at most every ``REFRESH_S``; ``pause`` returns only
after that long, so once it has returned no proxy starts a new call on the old weights (calls already in flight
finish). While paused, new calls get a 429 with ``Retry-After`` (mode ``reject``) or wait (mode ``wait``; at most
``POLAR_PAUSE_MAX_WAITERS`` per proxy process, the rest get the 429).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Literal, cast

import sqlalchemy as sa
from sqlalchemy.orm import Session as DbSession

from polar.clock import as_utc, utcnow
from polar.codec.wait_slots import WaitSlots
from polar.config import Config
from polar.errors import ValidationError
from polar.lifecycle.budget import give_back_pause
from polar.records.audit import EXPIRY_ACTOR, record
from polar.storage import db_clock
from polar.storage.database import Database
from polar.storage.models import EngineControl
from polar.storage.outage import unreachable

REFRESH_S = 0.5
MODES = ("reject", "wait")
PauseMode = Literal["reject", "wait"]


@dataclass(frozen=True)
class ControlState:
    paused: bool = False
    mode: PauseMode = "reject"
    policy_version: str | None = None


_STATE = sa.select(
    EngineControl.paused, EngineControl.mode, EngineControl.policy_version, EngineControl.paused_at
).where(EngineControl.id == 1)


def _read(db: Database) -> tuple[ControlState, datetime | None]:
    # A Core read: every proxy process makes it twice a second, and the ORM's identity map and unit of work cost
    # ~5% of a proxy's CPU at agent size for one row.
    with db.autocommit() as connection:
        row = connection.execute(_STATE).first()
    if row is None:
        return ControlState(), None
    return ControlState(row.paused, cast(PauseMode, row.mode), row.policy_version), as_utc(row.paused_at)


def read_state(db: Database) -> ControlState:
    return _read(db)[0]


def _control_row(session: DbSession) -> EngineControl:
    row = session.get(EngineControl, 1, with_for_update=True)
    if row is None:
        row = EngineControl(id=1, paused=False, mode="reject", policy_version=None, updated_at=utcnow())
        session.add(row)
    return row


def _db_now(session: DbSession) -> datetime:
    now = as_utc(session.scalar(sa.select(db_clock.now(session))))
    assert now is not None
    return now


def _resume(session: DbSession, row: EngineControl, now: datetime, credit_cap_s: float) -> None:
    # The harnesses whose calls the pause held had no use of that time: their budgets get it back.
    if row.paused_at is not None:
        give_back_pause(session, row.paused_at, now, credit_cap_s)
    row.paused_at = None
    row.paused, row.mode, row.updated_at = False, "reject", utcnow()


def set_state(
    db: Database,
    paused: bool,
    mode: str = "reject",
    policy_version: str | None = None,
    credit_cap_s: float = Config.max_pause_s,
) -> ControlState:
    """Pause or resume; a given ``policy_version`` replaces the current one (None keeps it). A resume gives each
    held harness back at most ``credit_cap_s`` (``POLAR_MAX_PAUSE``)."""
    if mode not in MODES:
        raise ValidationError(f"mode: must be one of {', '.join(MODES)}", field="mode")
    with db.unit() as session:
        row = _control_row(session)
        now = _db_now(session)
        if paused and not row.paused:
            row.paused_at = now
        elif not paused and row.paused:
            _resume(session, row, now, credit_cap_s)
        row.paused, row.mode, row.updated_at = paused, mode, utcnow()
        if policy_version is not None:
            row.policy_version = policy_version
        state = ControlState(row.paused, cast(PauseMode, row.mode), row.policy_version)
    if paused:
        time.sleep(REFRESH_S + 0.1)  # every proxy has re-read the row before the trainer starts syncing
    return state


@dataclass(frozen=True)
class ExpiredPause:
    """A pause the reconciler ended: the state after, when the pause began and how long it had held calls."""

    state: ControlState
    paused_at: datetime
    paused_s: float


def expire_pause(db: Database, max_pause_s: float) -> ExpiredPause | None:
    """Resume a pause that began more than ``max_pause_s`` ago (on the database's clock), as a resume without a
    new policy version would, with its audit row in the same transaction; None when there is none."""
    overdue = sa.and_(EngineControl.paused, EngineControl.paused_at < db_clock.ago(db, max_pause_s))
    with db.autocommit() as connection:  # each reconciler pass asks: a plain read, no lock, while none is overdue
        if connection.execute(sa.select(EngineControl.id).where(overdue)).first() is None:
            return None
    with db.unit() as session:
        row = session.get(EngineControl, 1, with_for_update=True)
        now = _db_now(session)
        paused_at = as_utc(row.paused_at) if row is not None else None
        if row is None or not row.paused or paused_at is None or (now - paused_at).total_seconds() <= max_pause_s:
            return None  # resumed (or paused anew) meanwhile
        _resume(session, row, now, max_pause_s)
        state = ControlState(row.paused, cast(PauseMode, row.mode), row.policy_version)
        paused_s = (now - paused_at).total_seconds()
        detail = {**dataclasses.asdict(state), "reason": "POLAR_MAX_PAUSE", "paused_at": paused_at.isoformat(),
                  "paused_s": round(paused_s, 3), "max_pause_s": max_pause_s}  # fmt: skip
        record(session, EXPIRY_ACTOR, "resume", "engine", detail, None)
    return ExpiredPause(state, paused_at, paused_s)


class ControlView:
    """A proxy's cached view of the control row, refreshed at most every ``REFRESH_S``."""

    def __init__(self, db: Database, max_waiters: int = 32) -> None:
        self._db = db
        self._waiters = WaitSlots(max_waiters)
        self._lock = threading.Lock()
        self._state = ControlState()
        self._paused_at: datetime | None = None
        self._read_at = float("-inf")

    @property
    def paused_at(self) -> datetime | None:
        """When the pause of the state last read began (None: not paused), on the database's clock."""
        with self._lock:
            return self._paused_at

    def current(self) -> ControlState:
        with self._lock:
            if time.monotonic() - self._read_at >= REFRESH_S:
                try:
                    self._state, self._paused_at = _read(self._db)
                except sa.exc.DBAPIError as exc:
                    if not unreachable(exc):
                        raise
                    # Nobody can pause or resume while the database is down: the last state read still holds.
                except sa.exc.TimeoutError:
                    pass  # every pooled connection busy: the last state read holds until the next refresh
                self._read_at = time.monotonic()
            return self._state

    def wait_until_resumed(self, timeout_s: float) -> ControlState:
        """The state once calls may proceed (or after ``timeout_s``, still paused). Only ``max_waiters`` calls
        wait at once; the rest get the paused state at once (the caller answers them as in ``reject`` mode)."""
        deadline = time.monotonic() + timeout_s
        state = self.current()
        if not state.paused:
            return state
        with self._waiters.hold() as held:
            while held and state.paused and time.monotonic() < deadline:
                time.sleep(REFRESH_S / 2)
                state = self.current()
        return state
