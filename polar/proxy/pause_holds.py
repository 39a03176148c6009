"""The proxy's note that a weight-sync pause held a session: the first of its calls a pause refuses (``reject``
mode, or ``wait`` mode out of waiters or time) or starts holding (``wait`` mode) stamps ``sessions.pause_held_at``
with the database's now. From then until resume the session's budget stands still, and at resume that time is
given back (``polar.lifecycle.budget``); a harness that works through a pause without asking for the model is
charged it.

    holds = PauseHolds(db)
    holds.held(session_id, paused_at)     # paused_at: the pause's start, as the proxy's control view read it

One write per session per pause: this process remembers whom it stamped during the pause that began at
``paused_at``, and the update changes the row only while calls are still paused and the session carries no stamp
of this pause (none, or a previous pause's). Best effort: with the database away or every connection busy the
session stays unstamped (a later refused call tries again) and the call is answered as it would have been. Nothing
here runs for a call while calls are not paused.
"""

from __future__ import annotations

import logging
import threading
import uuid
from datetime import datetime

import sqlalchemy as sa

from polar.storage import db_clock
from polar.storage.database import Database
from polar.storage.models import EngineControl, Session

log = logging.getLogger(__name__)


def stamp_held(db: Database, session_id: uuid.UUID) -> bool:
    """Stamp the session as held by the pause on now; False when calls are not paused any more or it was already
    stamped during this pause."""
    paused = sa.exists().where(
        EngineControl.paused,
        EngineControl.paused_at.is_not(None),
        sa.or_(Session.pause_held_at.is_(None), Session.pause_held_at < EngineControl.paused_at),
    )
    with db.unit() as session:
        stamped = session.execute(
            sa.update(Session)
            .where(Session.id == session_id, paused)
            .values(pause_held_at=db_clock.now(session))
            .returning(Session.id)
        ).first()
    return stamped is not None


class PauseHolds:
    """The sessions this proxy process stamped during the current pause."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self._lock = threading.Lock()
        self._pause: datetime | None = None
        self._stamped: set[uuid.UUID] = set()

    def held(self, session_id: uuid.UUID, paused_at: datetime | None) -> None:
        with self._lock:
            if paused_at != self._pause:  # a new pause: nobody is stamped yet
                self._pause, self._stamped = paused_at, set()
            if session_id in self._stamped:
                return
            self._stamped.add(session_id)
        try:
            stamp_held(self._db, session_id)
        except (sa.exc.DBAPIError, sa.exc.TimeoutError) as exc:  # away, or every connection busy
            with self._lock:
                self._stamped.discard(session_id)
            why = type(exc.orig if isinstance(exc, sa.exc.DBAPIError) else exc).__name__
            log.warning("could not note that the pause held session %s (%s); its budget runs on", session_id, why)
