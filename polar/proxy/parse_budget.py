"""The bytes of request bodies one proxy process parses at once, across every session it serves.

Each session parses at most ``max_concurrent_calls`` bodies at once (``polar.proxy.body_limits``), and a body of
``n`` bytes and ``v`` values grows memory by at most ``8 n + 160 v`` while it is parsed; but sessions add up, and
a process that parses enough large bodies at once runs out of memory, losing every call in flight. So a body is
parsed only while its bytes fit in the process's budget (``POLAR_PROXY_PARSE_BYTES``, 256 MiB): past it, the call
waits for room (parses take milliseconds), up to ``WAIT_S``, and is then refused with 429 (``Busy``), which SDKs
retry and which is on record as the infrastructure's (``busy``), never the policy's. A body larger than the whole
budget is parsed alone.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from polar.errors import Busy

WAIT_S = 30.0


class ParseBudget:
    """Bytes being parsed in this process, held to ``limit_bytes``."""

    def __init__(self, limit_bytes: int, wait_s: float = WAIT_S) -> None:
        self.limit_bytes = limit_bytes
        self.wait_s = wait_s
        self.held = 0
        self._room = threading.Condition()

    @contextmanager
    def hold(self, size: int) -> Iterator[None]:
        """The block runs with ``size`` bytes of the budget (all of it, for a body larger than the budget)."""
        size = min(size, self.limit_bytes)
        with self._room:
            deadline = time.monotonic() + self.wait_s
            while self.held + size > self.limit_bytes:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise Busy(
                        f"this proxy is parsing {self.held} bytes of request bodies, its bound "
                        f"(POLAR_PROXY_PARSE_BYTES {self.limit_bytes}); retry shortly",
                        retry_after_s=1,
                    )
                self._room.wait(left)
            self.held += size
        try:
            yield
        finally:
            with self._room:
                self.held -= size
                self._room.notify_all()
