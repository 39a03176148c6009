"""The database's clock: every time written by one machine and judged by another (heartbeats, deadlines, when a
message was sent, when a node was last seen) is taken from Postgres's ``now()``, so clock skew between machines
can never make a healthy lease look stale or a budget run out early.

    sa.update(Session).values(heartbeat_at=db_clock.now(db))
    sa.select(Session.id).where(Session.heartbeat_at < db_clock.ago(db, 30))

The embedded SQLite deployment runs on one machine, so there the process's own UTC clock is the database's.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa

from polar.clock import utcnow
from polar.storage.columns import is_postgres

_TIMESTAMP = sa.DateTime(timezone=True)


def now(target: Any) -> sa.ColumnElement[datetime]:
    """The database's time (Postgres: the transaction's start)."""
    return sa.func.now() if is_postgres(target) else sa.literal(utcnow(), _TIMESTAMP)


def ago(target: Any, seconds: float) -> sa.ColumnElement[datetime]:
    """The database's time ``seconds`` ago."""
    return shifted(target, -seconds)


def shifted(target: Any, seconds: float) -> sa.ColumnElement[datetime]:
    """The database's time plus ``seconds`` (negative: earlier)."""
    if is_postgres(target):
        return sa.func.now() + sa.func.make_interval(0, 0, 0, 0, 0, 0, sa.literal(float(seconds), sa.Float()))
    return sa.literal(utcnow() + timedelta(seconds=seconds), _TIMESTAMP)


def seconds_until(target: Any, moment: sa.ColumnElement[datetime]) -> sa.ColumnElement[float]:
    """Seconds from the database's now until ``moment`` (negative once past; null when ``moment`` is)."""
    if is_postgres(target):
        return sa.func.extract("epoch", moment - sa.func.now())
    return (sa.func.julianday(moment) - sa.func.julianday(sa.literal(utcnow(), _TIMESTAMP))) * 86400.0
