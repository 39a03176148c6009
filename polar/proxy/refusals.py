"""Refused calls, on record: a model call the proxy answers with an error before the engine ever saw it is still
something that happened to the harness, and postrun must know of it to judge how the attempt ended.

    declare_key(redis_url, key_hash)                       # run stage, as it mints the key
    counter = RefusalCounter(db, redis_url)
    counter.refused(key_hash, session_id, PAUSED)          # table call_refusals, +1
    counter.refused(key_hash, None, DATABASE_OUTAGE)       # Postgres away: Redis, per proxy key, +1 (and when)
    fold_in(db, redis_url, session_id, key_hash)           # postrun: Redis's counts and times into the table
    refusal_counts(db, session_id)                         # {"paused": 14, "database_outage": 3}

Reasons: ``paused`` (a weight-sync pause in ``reject`` mode, or ``wait`` mode out of waiters or time),
``database_outage`` (Polar could not reach its database) and ``busy`` (the proxy held key lookups during a flood of
unknown keys from the call's source, ``polar.proxy.key_misses``) are the infrastructure's; ``max_calls``,
``max_concurrent_calls`` and ``max_count_tokens`` (count-tokens calls) are the task's own limits, which the
harness's own calls ran into. A refusal made before the proxy knew the call's session (an
outage: the key is resolved in the database; a held lookup) is counted in Redis under the session's proxy key hash,
and postrun, which knows the key hash, folds the count in.

Redis keeps such counts only for a key that is a session's: one the run stage declared as it minted it
(``declare_key``), or one this proxy process resolved to its session before. A key the proxy cannot place is
counted only if declared, so made-up keys, which a sandbox can send by the thousand while Postgres is away or
lookups are held, leave nothing in Redis; a real key is found declared (its hash lives until its postrun folds it
in, at most ``REDIS_KEEP_S``).

Each reason's row keeps when its first and last refusal were (``first_at``, ``last_at``), so postrun can order them
against the harness's answers (``polar.lifecycle.attempts``). Rows written directly take the database's clock. A
refusal counted in Redis takes the refusing proxy machine's own UTC clock (Postgres was away, and its clock with
it), kept beside the count and folded in as its ``first_at`` / ``last_at``: the machines' clocks are assumed to be
kept in step (NTP), and a skew between them shifts only those refusals by as much.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime

import redis
import sqlalchemy as sa
from redis.exceptions import RedisError
from sqlalchemy.dialects import postgresql, sqlite

from polar.observability.metrics import MAX_CALLS, MAX_CONCURRENT_CALLS, MAX_COUNT_TOKENS, PAUSED
from polar.storage.database import Database
from polar.storage.models import CallRefusal

log = logging.getLogger(__name__)

DATABASE_OUTAGE = "database_outage"
BUSY = "busy"  # a key lookup held while a flood of unknown keys from the call's source lasts (Busy, 429)
REASONS = (PAUSED, DATABASE_OUTAGE, BUSY, MAX_CALLS, MAX_CONCURRENT_CALLS, MAX_COUNT_TOKENS)
# Refusals caused by the infrastructure: a harness that gave up after one of these is not the policy's failure.
INFRASTRUCTURE_REASONS = (PAUSED, DATABASE_OUTAGE, BUSY)
REDIS_TIMEOUT_S = 2.0
# Kept in Redis at most this long unfolded (a session's postrun folds them in within its budget).
REDIS_KEEP_S = 7 * 24 * 3600
# The field a declared key's hash is made with (``declare_key``); its ``:`` keeps it out of the counts (``_folded``).
_DECLARED = "key:declared_at"
# One refusal counted in Redis in one round trip. KEYS[1]: the key's hash; ARGV: the reason, its first and last time
# fields, the time, how long to keep the hash, and "1" to count only under a hash already there (a declared key's).
_COUNT = """
if ARGV[6] == "1" and redis.call("exists", KEYS[1]) == 0 then
    return 0
end
redis.call("hincrby", KEYS[1], ARGV[1], 1)
redis.call("hsetnx", KEYS[1], ARGV[2], ARGV[4])
redis.call("hset", KEYS[1], ARGV[3], ARGV[4])
redis.call("expire", KEYS[1], ARGV[5])
return 1
"""


def _redis_key(key_hash: str) -> str:
    return f"polar:refusals:{{{key_hash}}}"


def _time_field(which: str, reason: str) -> str:
    """The Redis hash field beside a reason's count that holds its first or last refusal's time (epoch seconds)."""
    return f"{which}_at:{reason}"


def _connect(redis_url: str) -> redis.Redis:
    return redis.Redis.from_url(redis_url, socket_timeout=REDIS_TIMEOUT_S, socket_connect_timeout=REDIS_TIMEOUT_S)


def add_counts(
    db: Database,
    session_id: uuid.UUID,
    counts: Mapping[str, int],
    times: Mapping[str, tuple[datetime, datetime]] | None = None,
) -> None:
    """Add ``counts`` (reason -> refused calls) to the session's rows, in one statement per reason, refused between
    ``times[reason]`` (first, last; default: the database's now). A row keeps its earliest ``first_at`` and latest
    ``last_at``."""
    dialect = postgresql if db.is_postgres else sqlite
    now = sa.func.now() if db.is_postgres else sa.func.current_timestamp()
    latest, earliest = (sa.func.greatest, sa.func.least) if db.is_postgres else (sa.func.max, sa.func.min)
    with db.unit() as session:
        for reason, count in counts.items():
            if count <= 0:
                continue
            first, last = (times or {}).get(reason, (now, now))
            statement = dialect.insert(CallRefusal).values(
                session_id=session_id, reason=reason, count=count, first_at=first, last_at=last
            )
            statement = statement.on_conflict_do_update(
                index_elements=[CallRefusal.session_id, CallRefusal.reason],
                set_={
                    "count": CallRefusal.count + statement.excluded.count,
                    "first_at": earliest(CallRefusal.first_at, statement.excluded.first_at),
                    "last_at": latest(CallRefusal.last_at, statement.excluded.last_at),
                },
            )
            session.execute(statement)


def declare_key(redis_url: str | None, key_hash: str) -> None:
    """Declare ``key_hash`` a session's proxy key to Redis (the run stage, as it mints the key, before the harness
    can use it), so refusals counted there before any proxy knows the key's session are kept for it. Best effort:
    with Redis away, only the refusals no proxy process could place are lost."""
    if not redis_url:
        return
    client = _connect(redis_url)
    try:
        pipe = client.pipeline()
        pipe.hsetnx(_redis_key(key_hash), _DECLARED, repr(time.time()))
        pipe.expire(_redis_key(key_hash), REDIS_KEEP_S)
        pipe.execute()
    except RedisError as exc:
        log.warning("could not declare a session's proxy key to Redis: %s", exc)
    finally:
        client.close()


class RefusalCounter:
    """The proxy's record of the calls it refused (best effort: the harness gets its error either way)."""

    def __init__(self, db: Database, redis_url: str | None) -> None:
        self.db = db
        self._redis = _connect(redis_url) if redis_url else None
        self._count = self._redis.register_script(_COUNT) if self._redis is not None else None

    def refused(self, key_hash: str | None, session_id: uuid.UUID | None, reason: str) -> None:
        """Count one refused call of ``session_id`` (None: the proxy could not place the key) for ``reason``: in
        the database, or in Redis under ``key_hash`` when the database is away or the session unknown."""
        if reason != DATABASE_OUTAGE and session_id is not None:
            try:
                add_counts(self.db, session_id, {reason: 1})
                return
            except (sa.exc.DBAPIError, sa.exc.TimeoutError) as exc:  # away, or every connection busy: Redis keeps it
                why = type(exc.orig if isinstance(exc, sa.exc.DBAPIError) else exc).__name__
                log.warning("could not record a refused call in the database (%s)", why)
        if key_hash is None or self._count is None:
            log.warning("a refused call (%s) could not be recorded: no session key or no Redis", reason)
            return
        at = repr(time.time())  # this machine's clock: Postgres, and its clock, may be away
        fields = (reason, _time_field("first", reason), _time_field("last", reason), at, REDIS_KEEP_S)
        try:
            # A key this process placed is a session's; any other is counted only if declared (made-up keys are not).
            self._count(keys=[_redis_key(key_hash)], args=[*fields, "0" if session_id is not None else "1"])
        except RedisError as exc:
            log.warning("could not count a refused call (%s) in Redis: %s", reason, exc)

    def close(self) -> None:
        if self._redis is not None:
            self._redis.close()


def fold_in(db: Database, redis_url: str | None, session_id: uuid.UUID, key_hash: str | None) -> None:
    """Move the refusals Redis counted for the session's proxy key into its rows. The counts are taken and the
    key deleted in one transaction, so a redelivered postrun never adds them twice (one that dies between the two
    steps loses them: they only ever make an attempt look more like the infrastructure's loss)."""
    if not redis_url or not key_hash:
        return
    client = _connect(redis_url)
    try:
        pipe = client.pipeline()
        pipe.hgetall(_redis_key(key_hash))
        pipe.delete(_redis_key(key_hash))
        counted, _ = pipe.execute()
    except RedisError as exc:
        log.warning("could not read the refused calls Redis counted for session %s: %s", session_id, exc)
        return
    finally:
        client.close()
    counts, times = _folded(counted)
    if counts:
        add_counts(db, session_id, counts, times)


def _folded(counted: Mapping[bytes, bytes]) -> tuple[dict[str, int], dict[str, tuple[datetime, datetime]]]:
    """A Redis hash's counts by reason, and the first and last refusal's times of each that has them (counts an
    older proxy kept carry none: they take the fold's time, as they always did)."""
    fields = {name.decode(): value.decode() for name, value in counted.items()}
    counts = {name: int(value) for name, value in fields.items() if ":" not in name}
    times: dict[str, tuple[datetime, datetime]] = {}
    for reason in counts:
        first, last = fields.get(_time_field("first", reason)), fields.get(_time_field("last", reason))
        if first is not None and last is not None:
            at = [datetime.fromtimestamp(float(value), UTC) for value in (first, last)]
            times[reason] = (min(at), max(at))
    return counts, times


def refusal_counts(db: Database, session_id: uuid.UUID) -> dict[str, int]:
    """The session's refused calls by reason."""
    with db.unit() as session:
        rows = session.execute(
            sa.select(CallRefusal.reason, CallRefusal.count).where(CallRefusal.session_id == session_id)
        ).all()
    return {row.reason: int(row.count) for row in rows}
