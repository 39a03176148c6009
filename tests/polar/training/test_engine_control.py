"""Calls held by a ``wait`` pause take a proxy thread each: at most ``POLAR_PAUSE_MAX_WAITERS`` wait at once in a
process, and the rest are answered as in ``reject`` mode (429, Retry-After) rather than pinning every thread."""

from __future__ import annotations

import threading
import time

from polar.storage.database import Database
from polar.training.engine_control import ControlState, ControlView, set_state


def test_pause_waiters_are_bounded(database_url: str) -> None:
    db = Database(database_url)
    try:
        set_state(db, True, "wait", "v1")
        view = ControlView(db, max_waiters=1)
        held: list[ControlState] = []
        holder = threading.Thread(target=lambda: held.append(view.wait_until_resumed(2.0)))
        holder.start()
        time.sleep(0.3)
        started = time.monotonic()
        second = view.wait_until_resumed(2.0)
        assert time.monotonic() - started < 0.5 and second.paused  # not held: the caller answers 429
        set_state(db, False, "reject", "v2")
        holder.join()
        assert held and not held[0].paused and held[0].policy_version == "v2"
    finally:
        db.dispose()
