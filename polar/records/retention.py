"""Retention (``polar gc``, docs/retention.md): what batches that finished long ago captured is deleted.

    policy = RetentionPolicy(parse_age("30d"), keep_trajectories=False, dry_run=False)
    total = collect_garbage(database, policy, progress=lambda batch_id, done, finished: ...)

A batch is eligible once it finished (``finished_at``: every session terminal) before the cutoff, on the
database's clock; a batch still running, or finished since, is never touched.

- By default the whole batch goes: its calls, trajectories, session events, sessions, tasks, callback events.
- ``keep_trajectories`` keeps every row (batches, tasks, sessions, events, trajectories, calls with their token ids
  and logprobs) and empties the captured bodies (``request``, ``normalized_request``, ``response`` become ``{}``)
  of every call but each session's last successful one, which the SFT export reads (stored whole first: it may be
  a delta on the calls being emptied). Exports, the feed and the SQL
  views read the same afterwards; the bodies, which repeat the whole conversation on every call, are most of the
  disk.

Prompts are stored as deltas on an earlier call of the *same session* (``polar.storage.prompts``), never of
another session or batch, so deleting a batch's calls cannot break another batch's prompts, and stripping bodies
keeps every delta.

Work is bounded: sessions go ``chunk_sessions`` at a time (fewer when they hold many calls), one transaction
each, so a batch of 100,000 sessions never holds one long transaction and its locks; the batch row and its audit
row (``audit_log``, actor ``cli:gc``) go in the last transaction. Interrupted, a batch is left partly deleted but
still eligible, and the next run finishes it; a batch already stripped is known by its audit row and skipped, so
running again changes nothing. Postgres reuses the freed space after (auto)vacuum; SQLite after ``VACUUM``.
"""

from __future__ import annotations

import dataclasses
import re
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.orm import Session as DbSession

from polar.contract.states import TERMINAL
from polar.errors import ValidationError
from polar.records.audit import record
from polar.storage import db_clock
from polar.storage.calls.retention import counted_calls, delete_calls, strip_bodies, strippable_calls
from polar.storage.database import Database
from polar.storage.media import delete_unreferenced
from polar.storage.models import AuditEvent, Batch, CallbackEvent, Session, SessionEvent, Task, Trajectory

ACTOR = "cli:gc"
ACTION = "gc"
DELETE, KEEP_TRAJECTORIES = "delete", "keep_trajectories"
CHUNK_SESSIONS = 500
CHUNK_CALLS = 20_000  # a chunk stops taking sessions once it holds this many calls (one session always fits)
_AGE = re.compile(r"([1-9][0-9]*)([mhdw])")
_UNITS = {"m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
_TERMINAL = sorted(state.value for state in TERMINAL)

Progress = Callable[[uuid.UUID, "GcCounts", bool], None]


def parse_age(text: str) -> timedelta:
    """``30d``, ``12h``, ``90m``, ``2w``: a positive whole number and a unit."""
    match = _AGE.fullmatch(text)
    if match is None:
        raise ValidationError(
            f"older than: expected a whole number and a unit (m, h, d or w), like 30d, 12h, 90m or 2w; got {text!r}",
            field="older_than",
        )
    return timedelta(**{_UNITS[match[2]]: int(match[1])})


@dataclass(frozen=True)
class RetentionPolicy:
    older_than: timedelta
    keep_trajectories: bool = False
    dry_run: bool = False
    chunk_sessions: int = CHUNK_SESSIONS

    @property
    def mode(self) -> str:
        return KEEP_TRAJECTORIES if self.keep_trajectories else DELETE

    @property
    def verb(self) -> str:
        """What applying it does, for reports: ``deleted``, ``would strip the call bodies of``, …"""
        if self.keep_trajectories:
            return "would strip the call bodies of" if self.dry_run else "stripped the call bodies of"
        return "would delete" if self.dry_run else "deleted"


@dataclass(frozen=True)
class GcCounts:
    """Rows deleted (or, keeping trajectories, calls whose bodies were emptied) and the bodies' stored bytes."""

    batches: int = 0
    sessions: int = 0
    calls: int = 0
    trajectories: int = 0
    session_events: int = 0
    tasks: int = 0
    callback_events: int = 0
    payload_bytes: int = 0
    images: int = 0  # stored images no call or trajectory names any more (``polar.storage.media``)
    image_bytes: int = 0

    def __add__(self, other: GcCounts) -> GcCounts:
        return GcCounts(*(getattr(self, f.name) + getattr(other, f.name) for f in dataclasses.fields(self)))

    def describe(self, keep_trajectories: bool) -> str:
        """``3 sessions, 6 calls, 3 trajectories, 21 events, 48.2 kB of call bodies`` (keeping trajectories: the
        calls emptied and their bytes)."""
        bodies = f"{_size(self.payload_bytes)} of call bodies"
        images = f", {_plural(self.images, 'image')} ({_size(self.image_bytes)})" if self.images else ""
        if keep_trajectories:
            return f"{_plural(self.calls, 'call')}, {bodies}{images}"
        return (
            f"{_plural(self.sessions, 'session')}, {_plural(self.calls, 'call')}, "
            f"{_plural(self.trajectories, 'trajectory', 'trajectories')}, {_plural(self.session_events, 'event')}, "
            f"{bodies}{images}"
        )


def _plural(n: int, word: str, plural: str | None = None) -> str:
    return f"{n} {word if n == 1 else plural or word + 's'}"


def _size(n: int) -> str:
    size, unit = float(n), "B"
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if size < 1000 or unit == "TB":
            break
        size /= 1000
    return f"{n} B" if unit == "B" else f"{size:.1f} {unit}"


def collect_garbage(database: Database, policy: RetentionPolicy, progress: Progress | None = None) -> GcCounts:
    """Apply ``policy`` to every eligible batch, oldest first; ``progress(batch_id, done, finished)`` is called after
    each committed chunk (``done``: that batch's counts so far). With ``dry_run``, only counts."""
    with database.unit() as db:
        cutoff = db.scalar(sa.select(db_clock.ago(db, policy.older_than.total_seconds())))
        assert cutoff is not None
        batches = _eligible(db, cutoff, policy)
    total = GcCounts()
    for batch_id, name in batches:
        if policy.dry_run:
            done = _planned(database, batch_id, policy)
        elif policy.keep_trajectories:
            done = _strip_batch(database, batch_id, name, cutoff, policy, progress)
        else:
            done = _delete_batch(database, batch_id, name, cutoff, policy, progress)
        if progress is not None:
            progress(batch_id, done, True)
        total += done
    if not policy.dry_run and database.is_postgres:
        # Images are shared across sessions and batches: one no call and no trajectory names any more goes
        # (only one stored before the cutoff, so none a call being recorded now has just written).
        with database.engine.begin() as connection:
            images, image_bytes = delete_unreferenced(connection, cutoff)
        total += GcCounts(images=images, image_bytes=image_bytes)
    return total


def _eligible(db: DbSession, cutoff: datetime, policy: RetentionPolicy) -> list[tuple[uuid.UUID, str | None]]:
    unfinished = sa.exists().where(Session.batch_id == Batch.id, Session.state.not_in(_TERMINAL))
    rows = db.execute(
        sa.select(Batch.id, Batch.name)
        .where(Batch.finished_at.is_not(None), Batch.finished_at < cutoff, ~unfinished)
        .order_by(Batch.finished_at, Batch.id)
    ).all()
    if not policy.keep_trajectories:
        return [(row.id, row.name) for row in rows]
    stripped = set(
        db.scalars(
            sa.select(AuditEvent.target).where(
                AuditEvent.action == ACTION, AuditEvent.detail["mode"].as_string() == KEEP_TRAJECTORIES
            )
        )
    )
    return [(row.id, row.name) for row in rows if str(row.id) not in stripped]


def _still_eligible(db: DbSession, batch_id: uuid.UUID, cutoff: datetime) -> bool:
    return db.scalar(sa.select(Batch.id).where(Batch.id == batch_id, Batch.finished_at < cutoff)) is not None


def _chunk(db: DbSession, batch_id: uuid.UUID, after: uuid.UUID | None, limit: int) -> list[uuid.UUID]:
    """The batch's next sessions (by id, after ``after``): at most ``limit``, and about ``CHUNK_CALLS`` calls."""
    query = sa.select(Session.id, Session.num_calls).where(Session.batch_id == batch_id)
    if after is not None:
        query = query.where(Session.id > after)
    chosen: list[uuid.UUID] = []
    calls = 0
    for session_id, num_calls in db.execute(query.order_by(Session.id).limit(limit)):
        if chosen and calls + num_calls > CHUNK_CALLS:
            break
        chosen.append(session_id)
        calls += num_calls
    return chosen


def _rows(db: DbSession, statement: sa.Executable) -> int:
    """Run a bulk DELETE / UPDATE (no ORM bookkeeping); how many rows it changed."""
    result = db.execute(statement, execution_options={"synchronize_session": False})
    return int(cast(sa.CursorResult[Any], result).rowcount)


def _delete_sessions(db: DbSession, ids: Sequence[uuid.UUID]) -> GcCounts:
    """Delete these sessions and what hangs off them, children first (each delete's count is its own)."""
    calls, payload = delete_calls(db, ids)
    trajectories = _rows(db, sa.delete(Trajectory).where(Trajectory.session_id.in_(ids)))
    events = _rows(db, sa.delete(SessionEvent).where(SessionEvent.session_id.in_(ids)))
    sessions = _rows(db, sa.delete(Session).where(Session.id.in_(ids)))
    return GcCounts(sessions=sessions, calls=calls, trajectories=trajectories, session_events=events,
                    payload_bytes=payload)  # fmt: skip


def _audit(db: DbSession, batch_id: uuid.UUID, name: str | None, policy: RetentionPolicy, done: GcCounts) -> None:
    detail = {"mode": policy.mode, "older_than_s": int(policy.older_than.total_seconds()), "batch_name": name,
              **dataclasses.asdict(done)}  # fmt: skip
    record(db, ACTOR, ACTION, str(batch_id), detail, None)


def _delete_batch(
    database: Database,
    batch_id: uuid.UUID,
    name: str | None,
    cutoff: datetime,
    policy: RetentionPolicy,
    progress: Progress | None,
) -> GcCounts:
    done = GcCounts()
    while True:
        with database.unit() as db:
            if not _still_eligible(db, batch_id, cutoff):
                return done
            ids = _chunk(db, batch_id, None, policy.chunk_sessions)
            if ids:
                done += _delete_sessions(db, ids)
        if not ids:
            break
        if progress is not None:
            progress(batch_id, done, False)
    with database.unit() as db:
        if not _still_eligible(db, batch_id, cutoff):
            return done
        callbacks = _rows(db, sa.delete(CallbackEvent).where(CallbackEvent.batch_id == batch_id))
        tasks = _rows(db, sa.delete(Task).where(Task.batch_id == batch_id))
        _rows(db, sa.delete(Batch).where(Batch.id == batch_id))
        done += GcCounts(batches=1, tasks=tasks, callback_events=callbacks)
        _audit(db, batch_id, name, policy, done)
    return done


def _strip_batch(
    database: Database,
    batch_id: uuid.UUID,
    name: str | None,
    cutoff: datetime,
    policy: RetentionPolicy,
    progress: Progress | None,
) -> GcCounts:
    done, after = GcCounts(), None
    while True:
        with database.unit() as db:
            if not _still_eligible(db, batch_id, cutoff):
                return done
            ids = _chunk(db, batch_id, after, policy.chunk_sessions)
            if ids:
                emptied, payload = strip_bodies(db, ids)
                done += GcCounts(calls=emptied, payload_bytes=payload)
        if not ids:
            break
        after = ids[-1]
        if progress is not None:
            progress(batch_id, done, False)
    with database.unit() as db:
        done += GcCounts(batches=1)
        _audit(db, batch_id, name, policy, done)
    return done


def _planned(database: Database, batch_id: uuid.UUID, policy: RetentionPolicy) -> GcCounts:
    """What applying ``policy`` to the batch would count, read in one transaction."""
    with database.unit() as db:
        session_ids = sa.select(Session.id).where(Session.batch_id == batch_id).scalar_subquery()
        if policy.keep_trajectories:
            calls, payload = strippable_calls(db, sa.select(Session.id).where(Session.batch_id == batch_id))
            return GcCounts(batches=1, calls=calls, payload_bytes=payload)

        def count(table: Any, where: sa.ColumnElement[bool]) -> int:
            return int(db.scalar(sa.select(sa.func.count()).select_from(table).where(where)) or 0)

        calls, payload = counted_calls(db, session_ids)
        return GcCounts(
            batches=1,
            sessions=count(Session, Session.batch_id == batch_id),
            calls=calls,
            trajectories=count(Trajectory, Trajectory.session_id.in_(session_ids)),
            session_events=count(SessionEvent, SessionEvent.session_id.in_(session_ids)),
            tasks=count(Task, Task.batch_id == batch_id),
            callback_events=count(CallbackEvent, CallbackEvent.batch_id == batch_id),
            payload_bytes=payload,
        )
