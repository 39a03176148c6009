"""Whose a proxy key is: the session it was minted for (looked up by the key's sha256, ``polar.proxy.keys``),
that session's state, and its task's call limits, read in one round trip."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import sqlalchemy as sa

from polar.storage.database import Database
from polar.storage.models import Session, Task

_sessions = Session.__table__
_tasks = Task.__table__
# With the task's call limits (polar.proxy.limits): read from its spec in the same round trip.
_SESSION_FOR_KEY = (
    sa.select(
        _sessions.c.id,
        _sessions.c.state,
        _tasks.c.spec["max_concurrent_calls"].as_integer().label("max_concurrent_calls"),
        _tasks.c.spec["max_calls"].as_integer().label("max_calls"),
        _tasks.c.spec["timeout_seconds"].as_float().label("timeout_seconds"),
        _tasks.c.spec["over_budget"].as_string().label("over_budget"),
        _tasks.c.spec["sampling"].as_string().label("sampling"),
    )
    .join(_tasks, _tasks.c.id == _sessions.c.task_pk)
    .where(_sessions.c.proxy_key_hash == sa.bindparam("key_hash"))
)


@dataclass(frozen=True)
class KeyOwner:
    """The session a proxy key belongs to, its state, and its task's call-limit fields (None: unset)."""

    session_id: uuid.UUID
    state: str
    max_concurrent_calls: int | None
    max_calls: int | None
    timeout_seconds: float | None
    over_budget: str | None = None  # refuse | stop (None: a task stored before the field: refuse)
    sampling: str | None = None  # record | neutralize (None: record)


def session_state_for_key(db: Database, key_hash: str) -> KeyOwner | None:
    """The session a proxy key belongs to, or None for an unknown key."""
    with db.autocommit() as connection:
        row = connection.execute(_SESSION_FOR_KEY, {"key_hash": key_hash}).first()
    if row is None:
        return None
    return KeyOwner(
        row.id, row.state, row.max_concurrent_calls, row.max_calls, row.timeout_seconds, row.over_budget, row.sampling
    )
