"""Refused calls, on record: a model call the proxy answers with an error before the engine ever saw it is still
something that happened to the harness, and postrun must know of it to judge how the attempt ended.

    counter = RefusalCounter(db, redis_url)
    counter.refused(key_hash, session_id, PAUSED)          # table call_refusals, +1
    counter.refused(key_hash, None, DATABASE_OUTAGE)       # Postgres away: Redis, per proxy key, +1 (and when)
    fold_in(db, redis_url, session_id, key_hash)           # postrun: Redis's counts and times into the table
    refusal_counts(db, session_id)                         # {"paused": 14, "database_outage": 3}

Reasons: ``paused`` (a weight-sync pause in ``reject`` mode, or ``wait`` mode out of waiters or time) and
``database_outage`` (Polar could not reach its database) are the infrastructure's; ``max_calls`` and
``max_concurrent_calls`` are the task's own limits. A refusal for a database outage cannot be written to the
database, so it is counted in Redis under the session's proxy key hash (the proxy may not even know the session
yet: the key is resolved in the database), and postrun, which knows the key hash, folds the count in.

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

from polar.observability.metrics import MAX_CALLS, MAX_CONCURRENT_CALLS, PAUSED
from polar.storage.database import Database
from polar.storage.models import CallRefusal

log = logging.getLogger(__name__)

DATABASE_OUTAGE = "database_outage"
REASONS = (PAUSED, DATABASE_OUTAGE, MAX_CALLS, MAX_CONCURRENT_CALLS)
# Refusals caused by the infrastructure: a harness that gave up after one of these is not the policy's failure.
INFRASTRUCTURE_REASONS = (PAUSED, DATABASE_OUTAGE)
REDIS_TIMEOUT_S = 2.0
# Kept in Redis at most this long unfolded (a session's postrun folds them in within its budget).
REDIS_KEEP_S = 7 * 24 * 3600


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


class RefusalCounter:
    """The proxy's record of the calls it refused (best effort: the harness gets its error either way)."""

    def __init__(self, db: Database, redis_url: str | None) -> None:
        self.db = db
        self._redis = _connect(redis_url) if redis_url else None

    def refused(self, key_hash: str | None, session_id: uuid.UUID | None, reason: str) -> None:
        if reason != DATABASE_OUTAGE and session_id is not None:
            try:
                add_counts(self.db, session_id, {reason: 1})
                return
            except (sa.exc.DBAPIError, sa.exc.TimeoutError) as exc:  # away, or every connection busy: Redis keeps it
                why = type(exc.orig if isinstance(exc, sa.exc.DBAPIError) else exc).__name__
                log.warning("could not record a refused call in the database (%s)", why)
        if key_hash is None or self._redis is None:
            log.warning("a refused call (%s) could not be recorded: no session key or no Redis", reason)
            return
        try:
            at = repr(time.time())  # this machine's clock: Postgres, and its clock, are away
            pipe = self._redis.pipeline()
            pipe.hincrby(_redis_key(key_hash), reason, 1)
            pipe.hsetnx(_redis_key(key_hash), _time_field("first", reason), at)
            pipe.hset(_redis_key(key_hash), _time_field("last", reason), at)
            pipe.expire(_redis_key(key_hash), REDIS_KEEP_S)
            pipe.execute()
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
