"""Refused calls, on record: a model call the proxy answers with an error before the engine ever saw it is still
something that happened to the harness, and postrun must know of it to judge how the attempt ended.

    counter = RefusalCounter(db, redis_url)
    counter.refused(key_hash, session_id, PAUSED)          # table call_refusals, +1
    counter.refused(key_hash, None, DATABASE_OUTAGE)       # Postgres away: Redis, per proxy key, +1
    fold_in(db, redis_url, session_id, key_hash)           # postrun: Redis's counts into the table
    refusal_counts(db, session_id)                         # {"paused": 14, "database_outage": 3}

Reasons: ``paused`` (a weight-sync pause in ``reject`` mode, or ``wait`` mode out of waiters or time) and
``database_outage`` (Polar could not reach its database) are the infrastructure's; ``max_calls`` and
``max_concurrent_calls`` are the task's own limits. A refusal for a database outage cannot be written to the
database, so it is counted in Redis under the session's proxy key hash (the proxy may not even know the session
yet: the key is resolved in the database), and postrun, which knows the key hash, folds the count in.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping

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


def _connect(redis_url: str) -> redis.Redis:
    return redis.Redis.from_url(redis_url, socket_timeout=REDIS_TIMEOUT_S, socket_connect_timeout=REDIS_TIMEOUT_S)


def add_counts(db: Database, session_id: uuid.UUID, counts: Mapping[str, int]) -> None:
    """Add ``counts`` (reason -> refused calls) to the session's rows, in one statement per reason."""
    dialect = postgresql if db.is_postgres else sqlite
    now = sa.func.now() if db.is_postgres else sa.func.current_timestamp()
    with db.unit() as session:
        for reason, count in counts.items():
            if count <= 0:
                continue
            statement = dialect.insert(CallRefusal).values(
                session_id=session_id, reason=reason, count=count, first_at=now, last_at=now
            )
            statement = statement.on_conflict_do_update(
                index_elements=[CallRefusal.session_id, CallRefusal.reason],
                set_={"count": CallRefusal.count + statement.excluded.count, "last_at": statement.excluded.last_at},
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
            pipe = self._redis.pipeline()
            pipe.hincrby(_redis_key(key_hash), reason, 1)
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
    counts = {reason.decode(): int(count) for reason, count in counted.items()}
    if counts:
        add_counts(db, session_id, counts)


def refusal_counts(db: Database, session_id: uuid.UUID) -> dict[str, int]:
    """The session's refused calls by reason."""
    with db.unit() as session:
        rows = session.execute(
            sa.select(CallRefusal.reason, CallRefusal.count).where(CallRefusal.session_id == session_id)
        ).all()
    return {row.reason: int(row.count) for row in rows}
