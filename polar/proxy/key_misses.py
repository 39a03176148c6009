"""Unknown proxy keys cost Postgres a bounded amount, whatever a sandbox sends, and one source's flood of them
costs the others nothing.

Each key the proxy has not seen is one query (``session_state_for_key``). A sandbox sending made-up keys would
otherwise make every request a query, without limit. So, per proxy process:

- a key found unknown is remembered (``REMEMBER_S``, at most ``REMEMBERED`` keys) and refused again without a
  query (401, as the first time);
- lookups that find nothing are held to ``rate_per_s`` (a token bucket of ``burst``) per source, the address the
  request came from (``REMOTE_ADDR``: a sandbox's relay reaches the proxy from its run worker's host), and to
  ``process_rate_per_s`` (``process_burst``) over all sources, so Postgres's share stays bounded however many
  sources there are. Past either, a key not in the proxy's caches is not looked up: the call gets 429 with
  ``Retry-After`` (``Busy``), which harnesses' SDKs retry, and which is recorded (``polar.proxy.refusals``) so
  postrun counts a harness that gave up on it as the infrastructure's loss. A key the proxy knew (its positive
  cache, kept ``STALE_S`` past its freshness for this) still gets through, so running sessions keep calling while
  a flood lasts; only a session's first call in it waits, and only one from the flooding source.

The sources' budgets are kept for the ``SOURCES`` seen most recently; a source forgotten starts again with a full
burst, which the process's budget still bounds. Behind a load balancer every request has its address, so the
sources are one (run the proxy where the relays reach it directly).

    misses = KeyMisses()
    if misses.known_unknown(key_hash): refuse 401
    if not misses.may_look_up(source): refuse 429 (or use a stale positive entry)
    ... query; if nothing found: misses.missed(key_hash, source)
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable

RATE_PER_S = 20.0
BURST = 100
PROCESS_RATE_PER_S = 200.0  # ten sources flooding at once spend what Postgres is given for unknown keys
PROCESS_BURST = 1000
SOURCES = 4096
REMEMBER_S = 300.0
REMEMBERED = 20_000
STALE_S = 300.0  # how long past its freshness a known key's cache entry still serves while lookups are held


class _Bucket:
    """A token bucket: ``rate_per_s`` lookups a second, at most ``burst`` at once."""

    __slots__ = ("at", "burst", "rate_per_s", "tokens")

    def __init__(self, rate_per_s: float, burst: int, now: float) -> None:
        self.rate_per_s = rate_per_s
        self.burst = burst
        self.tokens = float(burst)
        self.at = now

    def refilled(self, now: float) -> _Bucket:
        self.tokens = min(float(self.burst), self.tokens + (now - self.at) * self.rate_per_s)
        self.at = now
        return self

    def spend(self) -> None:
        self.tokens = max(0.0, self.tokens - 1.0)


class KeyMisses:
    """The unknown keys one proxy process remembers, and its budgets (per source and in all) of lookups that find
    nothing."""

    def __init__(
        self,
        rate_per_s: float = RATE_PER_S,
        burst: int = BURST,
        clock: Callable[[], float] = time.monotonic,
        process_rate_per_s: float = PROCESS_RATE_PER_S,
        process_burst: int = PROCESS_BURST,
        sources: int = SOURCES,
    ) -> None:
        self.rate_per_s = rate_per_s
        self.burst = burst
        self._clock = clock
        self._process = _Bucket(process_rate_per_s, process_burst, clock())
        self._sources: OrderedDict[str, _Bucket] = OrderedDict()  # least recently seen first
        self._max_sources = sources
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

    def may_look_up(self, source: str | None = None) -> bool:
        """Whether a key not in any cache may be looked up now for a request from ``source``: not while that
        source's misses, or the process's, are over their rate."""
        with self._lock:
            now = self._clock()
            return self._source(source, now).tokens >= 1.0 and self._process.refilled(now).tokens >= 1.0

    def missed(self, key_hash: str, source: str | None = None) -> None:
        """A lookup for ``source`` found nothing: remember the key, and spend one of its source's lookups and one
        of the process's."""
        with self._lock:
            now = self._clock()
            self._source(source, now).spend()
            self._process.refilled(now).spend()
            self._unknown[key_hash] = now + REMEMBER_S
            self._unknown.move_to_end(key_hash)
            while len(self._unknown) > REMEMBERED:
                self._unknown.popitem(last=False)

    def _source(self, source: str | None, now: float) -> _Bucket:
        """``source``'s bucket, refilled to ``now`` (a new one, full, for a source not seen lately)."""
        name = source or ""
        bucket = self._sources.get(name)
        if bucket is None:
            bucket = self._sources[name] = _Bucket(self.rate_per_s, self.burst, now)
            while len(self._sources) > self._max_sources:
                self._sources.popitem(last=False)
        else:
            self._sources.move_to_end(name)
        return bucket.refilled(now)
