"""A bound on long-polls: each one holds a server thread while it waits, so a process lets only so many wait at
once (``POLAR_FEED_MAX_WAITERS`` on the API, ``POLAR_PAUSE_MAX_WAITERS`` on the proxy) and answers the rest at
once, keeping threads free for submissions, resumes and health checks."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class WaitSlots:
    """At most ``limit`` callers waiting at once in this process (0: none may wait)."""

    def __init__(self, limit: int) -> None:
        self.limit = max(0, limit)
        self._slots = threading.BoundedSemaphore(self.limit) if self.limit else None

    @contextmanager
    def hold(self) -> Iterator[bool]:
        """Yields True with a slot held for the block, False (nothing held) when every slot is taken."""
        held = self._slots is not None and self._slots.acquire(blocking=False)
        try:
            yield held
        finally:
            if held and self._slots is not None:
                self._slots.release()
