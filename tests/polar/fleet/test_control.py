"""Calls held by a ``wait`` pause take a proxy thread each: at most ``POLAR_PAUSE_MAX_WAITERS`` wait at once in a
process, and the rest are answered as in ``reject`` mode (429, Retry-After) rather than pinning every thread."""

from __future__ import annotations

import threading
from collections import Counter

from polar.fleet.control import ControlState, ControlView, set_state
from polar.storage.database import Database
from tests.processes import wait_until

HANG_GUARD_S = 60  # a hang guard, not a speed claim


class CountedView(ControlView):
    """Counts each caller's reads of the control row: one before it would wait, then one per poll while it waits."""

    def __init__(self, db: Database, max_waiters: int) -> None:
        super().__init__(db, max_waiters)
        self.reads: Counter[int] = Counter()

    def current(self) -> ControlState:
        self.reads[threading.get_ident()] += 1
        return super().current()


def test_pause_waiters_are_bounded(database_url: str) -> None:
    db = Database(database_url)
    try:
        set_state(db, True, "wait", "v1")
        view = CountedView(db, max_waiters=1)
        held: list[ControlState] = []
        # Held until the resume below, however long a loaded machine takes to get there.
        holder = threading.Thread(target=lambda: held.append(view.wait_until_resumed(HANG_GUARD_S)))
        holder.start()
        wait_until(lambda: view.reads[holder.ident or 0] >= 2, HANG_GUARD_S, "the first caller polling")
        # The first caller polls in the only slot now. The second is answered paused while the first still waits,
        # having read the row once: it never polled, it was not held (the caller answers 429).
        second = view.wait_until_resumed(2 * HANG_GUARD_S)
        assert holder.is_alive() and not held
        assert second.paused and view.reads[threading.get_ident()] == 1
        set_state(db, False, "reject", "v2")
        holder.join(HANG_GUARD_S)
        assert held and not held[0].paused and held[0].policy_version == "v2"
    finally:
        db.dispose()
