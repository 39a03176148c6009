"""Unknown proxy keys cost Postgres a bounded amount, whatever a sandbox sends.

Each key the proxy has not seen is one query (``session_state_for_key``). A sandbox sending made-up keys would
otherwise make every request a query, without limit. So, per proxy process:

- a key found unknown is remembered (``REMEMBER_S``, at most ``REMEMBERED`` keys) and refused again without a
  query (401, as the first time);
- lookups that find nothing are held to ``rate_per_s`` (a token bucket of ``burst``). Past it, a key not in the
  proxy's caches is not looked up: the call gets 429 with ``Retry-After`` (``Busy``), which harnesses' SDKs retry.
  A key the proxy knew (its positive cache, kept ``STALE_S`` past its freshness for this) still gets through, so
  running sessions keep calling while a flood lasts; only a session's first call in it waits.

    misses = KeyMisses()
    if misses.known_unknown(key_hash): refuse 401
    if not misses.may_look_up(): refuse 429 (or use a stale positive entry)
    ... query; if nothing found: misses.missed(key_hash)
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable

RATE_PER_S = 20.0
BURST = 100
REMEMBER_S = 300.0
REMEMBERED = 20_000
STALE_S = 300.0  # how long past its freshness a known key's cache entry still serves while lookups are held


class KeyMisses:
    """The unknown keys one proxy process remembers, and its budget of lookups that find nothing."""

    def __init__(self, rate_per_s: float = RATE_PER_S, burst: int = BURST,
                 clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        self.rate_per_s = rate_per_s
        self.burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._at = clock()
        self._unknown: OrderedDict[str, float] = OrderedDict()  # key hash -> until when it is refused unqueried
        self._lock = threading.Lock()  # the proxy's request threads share one

    def known_unknown(self, key_hash: str) -> bool:
        """Whether ``key_hash`` was found unknown lately (refuse it without a query)."""
        with self._lock:
            until = self._unknown.get(key_hash)
            if until is None:
                return False
            if until > self._clock():
                return True
            del self._unknown[key_hash]
            return False

    def may_look_up(self) -> bool:
        """Whether a key not in any cache may be looked up now: not while the misses are over their rate."""
        with self._lock:
            self._refill()
            return self._tokens >= 1.0

    def missed(self, key_hash: str) -> None:
        """A lookup found nothing: remember the key, and spend one of the budget's lookups."""
        with self._lock:
            self._refill()
            self._tokens = max(0.0, self._tokens - 1.0)
            self._unknown[key_hash] = self._clock() + REMEMBER_S
            self._unknown.move_to_end(key_hash)
            while len(self._unknown) > REMEMBERED:
                self._unknown.popitem(last=False)

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(float(self.burst), self._tokens + (now - self._at) * self.rate_per_s)
        self._at = now
