"""Holding model calls while a trainer syncs weights (``POST /v1/engine/pause`` / ``resume``), and the policy
version every captured call is stamped with. The paused time is given back to the budgets of the harnesses that
ran through it (``polar.lifecycle.budget``).

The state is one row in the database. Proxies re-read it at most every ``REFRESH_S``; ``pause`` returns only
after that long, so once it has returned no proxy starts a new call on the old weights (calls already in flight
finish). While paused, new calls get a 429 with ``Retry-After`` (mode ``reject``) or wait (mode ``wait``; at most
``POLAR_PAUSE_MAX_WAITERS`` per proxy process, the rest get the 429).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Literal, cast

import sqlalchemy as sa

from polar.clock import as_utc, utcnow
from polar.errors import ValidationError
from polar.lifecycle.budget import give_back_pause
from polar.storage import db_clock
from polar.storage.database import Database
from polar.storage.models import EngineControl
from polar.storage.outage import unreachable
from polar.training.wait_slots import WaitSlots

REFRESH_S = 0.5
MODES = ("reject", "wait")
PauseMode = Literal["reject", "wait"]


@dataclass(frozen=True)
class ControlState:
    paused: bool = False
    mode: PauseMode = "reject"
    policy_version: str | None = None


_STATE = sa.select(EngineControl.paused, EngineControl.mode, EngineControl.policy_version).where(EngineControl.id == 1)


def read_state(db: Database) -> ControlState:
    # A Core read: every proxy process makes it twice a second, and the ORM's identity map and unit of work cost
    # ~5% of a proxy's CPU at agent size for one row.
    with db.autocommit() as connection:
        row = connection.execute(_STATE).first()
    if row is None:
        return ControlState()
    return ControlState(row.paused, cast(PauseMode, row.mode), row.policy_version)


def set_state(db: Database, paused: bool, mode: str = "reject", policy_version: str | None = None) -> ControlState:
    """Pause or resume; a given ``policy_version`` replaces the current one (None keeps it)."""
    if mode not in MODES:
        raise ValidationError(f"mode: must be one of {', '.join(MODES)}", field="mode")
    with db.unit() as session:
        row = session.get(EngineControl, 1, with_for_update=True)
        if row is None:
            row = EngineControl(id=1, paused=False, mode="reject", policy_version=None, updated_at=utcnow())
            session.add(row)
        now = as_utc(session.scalar(sa.select(db_clock.now(session))))
        if paused and not row.paused:
            row.paused_at = now
        elif not paused and row.paused:
            # The harnesses that ran through the pause had no use of that time: their budgets get it back.
            if row.paused_at is not None and now is not None:
                give_back_pause(session, row.paused_at, now)
            row.paused_at = None
        row.paused, row.mode, row.updated_at = paused, mode, utcnow()
        if policy_version is not None:
            row.policy_version = policy_version
        state = ControlState(row.paused, cast(PauseMode, row.mode), row.policy_version)
    if paused:
        time.sleep(REFRESH_S + 0.1)  # every proxy has re-read the row before the trainer starts syncing
    return state


class ControlView:
    """A proxy's cached view of the control row, refreshed at most every ``REFRESH_S``."""

    def __init__(self, db: Database, max_waiters: int = 32) -> None:
        self._db = db
        self._waiters = WaitSlots(max_waiters)
        self._lock = threading.Lock()
        self._state = ControlState()
        self._read_at = float("-inf")

    def current(self) -> ControlState:
        with self._lock:
            if time.monotonic() - self._read_at >= REFRESH_S:
                try:
                    self._state = read_state(self._db)
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
