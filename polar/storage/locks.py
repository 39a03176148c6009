"""Transaction-scoped locks: Postgres advisory locks; SQLite needs none (its transactions begin IMMEDIATE)."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.orm import Session as DbSession

# Arbitrary, fixed advisory-lock keys; one per serialised activity.
ADMISSION = 7_310_001
RECONCILER = 7_310_002
FEED = 7_310_003


def exclusive(db: DbSession, key: int) -> None:
    """Wait for the lock ``key``; released when the transaction ends."""
    if db.get_bind().dialect.name == "postgresql":
        db.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": key})


def try_exclusive(db: DbSession, key: int) -> bool:
    """Take the lock ``key`` if free; False when another transaction holds it."""
    if db.get_bind().dialect.name != "postgresql":
        return True
    return bool(db.scalar(sa.text("SELECT pg_try_advisory_xact_lock(:key)"), {"key": key}))
