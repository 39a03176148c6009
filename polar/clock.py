"""Wall-clock time in UTC; SQLite hands back naive datetimes, so every read goes through ``as_utc``."""

from __future__ import annotations

from datetime import UTC, datetime


def utcnow() -> datetime:
    return datetime.now(UTC)


def as_utc(moment: datetime | None) -> datetime | None:
    if moment is None or moment.tzinfo is not None:
        return moment
    return moment.replace(tzinfo=UTC)


def iso(moment: datetime | None) -> str | None:
    moment = as_utc(moment)
    return moment.isoformat() if moment else None
