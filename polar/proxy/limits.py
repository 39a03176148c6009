"""Per-session call limits at the proxy, so a runaway harness cannot flood the engine: at most
``max_concurrent_calls`` of a session's calls in flight and ``max_calls`` in all (task fields; deployment
defaults ``POLAR_SESSION_MAX_CONCURRENT_CALLS`` / ``POLAR_SESSION_MAX_CALLS``). Counting tokens (Anthropic's
``count_tokens``, Gemini's ``countTokens``) is no model call but has the engine tokenise the whole conversation, so
those calls share the concurrency slots and count toward a total of their own, ``max_count_tokens``
(``POLAR_SESSION_MAX_COUNT_TOKENS``). A call over a limit raises ``TooManyCalls`` before anything is sent to the
engine.

The proxy runs as several gunicorn workers, maybe on several machines, so with Redis the counts are shared
(``RedisLimiter``): per session a sorted set of the calls in flight, scored by when they started on Redis's
clock, and counters of admitted model calls and count-tokens calls, all expiring ``keep_s`` after the session's
last call. A script admits a call in one round trip (drop in-flight entries older than ``hold_s``: a proxy that died
mid-call never released them; check both limits; add the call); ending it is a second. Without Redis (embedded mode) the
counts are this process's own (``LocalLimiter``); so is what a Redis limiter falls back to while Redis is
unreachable, so a Redis outage neither fails calls nor lifts the limits.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Final, Literal, Protocol

import redis
from redis.exceptions import RedisError

from polar.config import Config
from polar.errors import TooManyCalls

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 600.0  # TaskRequest.timeout_seconds' default, for a task stored without one
RETRY_AFTER_S = 1
REDIS_COOLDOWN_S = 5.0
REDIS_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class CallLimits:
    """One session's limits, and how long its counts are kept after its last call."""

    max_concurrent: int
    max_calls: int
    keep_s: int
    over_budget: str = "refuse"  # a call over max_calls: refused (429), or answered with a final stop (budget.py)
    max_count_tokens: int = 2000  # POLAR_SESSION_MAX_COUNT_TOKENS's default

    @classmethod
    def of_task(
        cls,
        config: Config,
        max_concurrent_calls: int | None,
        max_calls: int | None,
        timeout_s: float | None,
        over_budget: str | None = None,
    ) -> CallLimits:
        """The limits a task's sessions run under: its own fields, else the deployment's. A session's counts are
        kept for its whole budget after each call (it cannot call later than that) plus a call's longest hold."""
        return cls(
            max_concurrent=max_concurrent_calls or config.session_max_concurrent_calls,
            max_calls=max_calls or config.session_max_calls,
            keep_s=math.ceil((timeout_s or DEFAULT_TIMEOUT_S) + hold_s(config)),
            over_budget=over_budget or "refuse",
            max_count_tokens=config.session_max_count_tokens,
        )


def hold_s(config: Config) -> float:
    """The longest a live call holds its slot: the engine's answer, one retry with ``max_tokens`` fitted, and
    recording it through a database outage. An in-flight entry older than this belongs to a dead proxy."""
    return 2 * config.engine_timeout_s + config.db_outage_s


# The totals a call may count toward (``CallLimiter.slot``'s ``toward``).
Toward = Literal["max_calls", "max_count_tokens"]
MAX_CALLS: Final = "max_calls"
MAX_COUNT_TOKENS: Final = "max_count_tokens"


class CallLimiter(Protocol):
    def slot(
        self, session_id: uuid.UUID, limits: CallLimits, counted: bool = True, toward: Toward = MAX_CALLS
    ) -> AbstractContextManager[None]:
        """Hold one of the session's call slots for the ``with`` block (``counted``: the call also counts toward
        the total ``toward`` names, ``max_calls`` or ``max_count_tokens``); raises ``TooManyCalls`` instead when
        the session is over a limit."""
        ...

    def close(self) -> None: ...


def _over_concurrency(limits: CallLimits) -> TooManyCalls:
    return TooManyCalls(
        f"this session already has max_concurrent_calls ({limits.max_concurrent}) model calls in flight; "
        f"try again in {RETRY_AFTER_S}s",
        retry_after_s=RETRY_AFTER_S,
        limit="max_concurrent_calls",
    )


def _over_total(limits: CallLimits, toward: Toward) -> TooManyCalls:
    if toward == MAX_COUNT_TOKENS:
        return TooManyCalls(
            f"this session has made its max_count_tokens ({limits.max_count_tokens}) token-counting calls; no more "
            "are allowed (model calls still are)",
            limit=MAX_COUNT_TOKENS,
        )
    return TooManyCalls(f"this session has made its max_calls ({limits.max_calls}) model calls; no more are allowed")


def _cap(limits: CallLimits, toward: Toward) -> int:
    return limits.max_count_tokens if toward == MAX_COUNT_TOKENS else limits.max_calls


class _RefusalLog:
    """Warns once per session and limit in this process, then at debug level: a harness looping on its 429s
    would flood the log otherwise. Names the session, never its key."""

    def __init__(self, size: int = 10_000) -> None:
        self._seen: set[tuple[uuid.UUID, str]] = set()
        self._size = size
        self._lock = threading.Lock()

    def refused(self, session_id: uuid.UUID, exc: TooManyCalls) -> TooManyCalls:
        seen = (session_id, exc.limit)
        with self._lock:
            first = seen not in self._seen
            if first:
                if len(self._seen) >= self._size:
                    self._seen.clear()
                self._seen.add(seen)
        (log.warning if first else log.debug)("session %s: model call refused, not sent: %s", session_id, exc)
        return exc


@dataclass
class _Counts:
    in_flight: int = 0
    total: int = 0
    count_tokens: int = 0
    last_used: float = 0.0
    keep_s: float = 0.0


@dataclass
class LocalLimiter:
    """The counts in this process's memory: exact for one process, per process under several."""

    clock: Callable[[], float] = time.monotonic
    sweep_every_s: float = 60.0
    _sessions: dict[uuid.UUID, _Counts] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _next_sweep: float = 0.0
    _refusals: _RefusalLog = field(default_factory=_RefusalLog)

    @contextmanager
    def slot(
        self, session_id: uuid.UUID, limits: CallLimits, counted: bool = True, toward: Toward = MAX_CALLS
    ) -> Iterator[None]:
        self._acquire(session_id, limits, counted, toward)
        try:
            yield
        finally:
            with self._lock:
                counts = self._sessions.get(session_id)
                if counts is not None:
                    counts.in_flight -= 1
                    counts.last_used = self.clock()

    def _acquire(self, session_id: uuid.UUID, limits: CallLimits, counted: bool, toward: Toward) -> None:
        with self._lock:
            now = self.clock()
            if now >= self._next_sweep:
                self._sweep(now)
            counts = self._sessions.setdefault(session_id, _Counts())
            made = counts.count_tokens if toward == MAX_COUNT_TOKENS else counts.total
            if counted and made >= _cap(limits, toward):
                raise self._refusals.refused(session_id, _over_total(limits, toward))
            if counts.in_flight >= limits.max_concurrent:
                raise self._refusals.refused(session_id, _over_concurrency(limits))
            counts.in_flight += 1
            if toward == MAX_COUNT_TOKENS:
                counts.count_tokens += counted
            else:
                counts.total += counted
            counts.last_used, counts.keep_s = now, limits.keep_s

    def _sweep(self, now: float) -> None:
        """Forget sessions idle past their ``keep_s`` (the memory of a long-lived proxy stays bounded)."""
        idle = [sid for sid, c in self._sessions.items() if not c.in_flight and now - c.last_used > c.keep_s]
        for session_id in idle:
            del self._sessions[session_id]
        self._next_sweep = now + self.sweep_every_s

    def tracked(self) -> int:
        """How many sessions' counts are held."""
        with self._lock:
            return len(self._sessions)

    def close(self) -> None:
        pass


# KEYS: in-flight set, total counter (model calls', or count-tokens calls'). ARGV: call id, max_concurrent, that
# total's cap (0: not counted), hold_s, keep_s. Returns 1 admitted, -1 over max_concurrent, -2 over the total's cap.
_ACQUIRE = """
local now = redis.call('TIME')
local now_s = tonumber(now[1]) + tonumber(now[2]) / 1000000
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now_s - tonumber(ARGV[4]))
local max_calls = tonumber(ARGV[3])
if max_calls > 0 and tonumber(redis.call('GET', KEYS[2]) or '0') >= max_calls then return -2 end
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then return -1 end
if max_calls > 0 then
  redis.call('INCR', KEYS[2])
  redis.call('EXPIRE', KEYS[2], ARGV[5])
end
redis.call('ZADD', KEYS[1], now_s, ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[5])
return 1
"""


class RedisLimiter:
    """The counts in Redis, shared by every proxy process and machine."""

    def __init__(self, url: str, hold_s: float) -> None:
        self.hold_s = hold_s
        self._redis = redis.Redis.from_url(
            url, socket_timeout=REDIS_TIMEOUT_S, socket_connect_timeout=REDIS_TIMEOUT_S, health_check_interval=30
        )
        self._acquire_script = self._redis.register_script(_ACQUIRE)
        self._fallback = LocalLimiter()
        self._down_until = 0.0
        self._refusals = _RefusalLog()

    @staticmethod
    def _keys(session_id: uuid.UUID, toward: Toward = MAX_CALLS) -> tuple[str, str]:
        # One hash tag per session: the keys land on the same node of a Redis Cluster.
        total = "count_tokens" if toward == MAX_COUNT_TOKENS else "total"
        return f"polar:calls:{{{session_id}}}:inflight", f"polar:calls:{{{session_id}}}:{total}"

    @contextmanager
    def slot(
        self, session_id: uuid.UUID, limits: CallLimits, counted: bool = True, toward: Toward = MAX_CALLS
    ) -> Iterator[None]:
        call_id = self._acquire(session_id, limits, counted, toward)
        if call_id is None:  # Redis unreachable: this process's own counts
            with self._fallback.slot(session_id, limits, counted, toward):
                yield
            return
        try:
            yield
        finally:
            self._release(session_id, call_id)

    def _acquire(self, session_id: uuid.UUID, limits: CallLimits, counted: bool, toward: Toward) -> str | None:
        if time.monotonic() < self._down_until:
            return None
        call_id = uuid.uuid4().hex
        args: list[str | int | float] = [
            call_id, limits.max_concurrent, _cap(limits, toward) if counted else 0, self.hold_s, limits.keep_s
        ]  # fmt: skip
        try:
            admitted = int(self._acquire_script(keys=self._keys(session_id, toward), args=args))
        except RedisError as exc:
            self._down_until = time.monotonic() + REDIS_COOLDOWN_S
            log.warning("call limits: Redis unreachable (%s); this process counts on its own meanwhile", exc)
            return None
        if admitted == -2:
            raise self._refusals.refused(session_id, _over_total(limits, toward))
        if admitted == -1:
            raise self._refusals.refused(session_id, _over_concurrency(limits))
        return call_id

    def _release(self, session_id: uuid.UUID, call_id: str) -> None:
        try:
            self._redis.zrem(self._keys(session_id)[0], call_id)
        except RedisError as exc:  # the entry stops counting after hold_s
            log.warning("call limits: could not release a call in Redis (%s)", exc)

    def close(self) -> None:
        self._redis.close()


def call_limiter(config: Config) -> CallLimiter:
    """Redis-backed limits when the deployment has Redis, else this process's own."""
    if config.redis_url:
        return RedisLimiter(config.redis_url, hold_s(config))
    return LocalLimiter()
