"""Telling a trainer that data is ready: a batch's ``callback_url`` gets a POST when each group (every sample of a
task settled) has finished and when the whole batch has.

    {"event": "group_finished", "batch_id", "group_id", "task_id", "feed_position", "sessions": [...]}
    {"event": "batch_finished", "batch_id", "counts": {state: n}, "finished_at"}

A group's sessions and the batch's counts are each sample's latest attempt (``polar.lifecycle.attempts``).

Events are an outbox (table ``callback_events``): ``record_session_events`` writes them in the terminal
transaction that completes the group or the batch (exactly once: feed positions are handed out under a lock, so
the last session of a group to end is the one that sees it complete), and ``deliver_due`` POSTs them from a loop
of its own in every worker process, never from postrun or the reconciler: a receiver that is slow, refuses or
never answers delays nothing but its own events. Each event is tried up to ``MAX_ATTEMPTS`` times with growing
pauses (at most ``MAX_PAUSE_S``), then marked failed with its last error. Each POST goes only where
``polar.contract.callback_targets`` allows, checked again at send time.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import sqlalchemy as sa
from sqlalchemy.orm import Session as DbSession

from polar.clock import iso
from polar.codec.redaction import shown_url
from polar.contract.callback_targets import CallbackRefused, Target, resolve_target
from polar.lifecycle.attempts import OutcomeClass, is_latest_attempt
from polar.lifecycle.groups import group_id
from polar.services import Services
from polar.storage import db_clock
from polar.storage.models import Batch, CallbackEvent, Session, Task

log = logging.getLogger(__name__)

TIMEOUT_S = 5.0
MAX_ATTEMPTS = 10
MAX_PAUSE_S = 300.0
BATCH = 20  # events one delivery pass takes


def _group_event(db: DbSession, session: Session, task: Task) -> dict[str, Any] | None:
    members = db.execute(
        sa.select(
            Session.id, Session.sample_index, Session.attempt, Session.state, Session.reward, Session.feed_seq,
            Session.outcome_class,
        )
        .where(Session.task_pk == session.task_pk, is_latest_attempt())
        .order_by(Session.sample_index)
    ).all()  # fmt: skip
    settled = [m for m in members if m.feed_seq is not None]
    # Only the session that settled the group last speaks for it.
    if len(settled) < task.num_samples or max(m.feed_seq for m in settled) != session.feed_seq:
        return None
    return {
        "event": "group_finished",
        "batch_id": str(session.batch_id),
        "group_id": group_id(session.batch_id, task.position, task.spec.get("metadata")),
        "task_id": session.task_id,
        "feed_position": session.feed_seq,
        "sessions": [
            {
                "session_id": str(m.id),
                "sample_index": m.sample_index,
                "attempt": m.attempt,
                "state": m.state,
                # An excluded attempt's reward is kept for the record, never served (polar.lifecycle.attempts).
                "reward": None if m.outcome_class == OutcomeClass.EXCLUDED.value else m.reward,
                "outcome_class": m.outcome_class,
            }
            for m in members
        ],
    }


def batch_event(db: DbSession, batch: Batch) -> dict[str, Any]:
    counts = dict(
        db.execute(
            sa.select(Session.state, sa.func.count())
            .where(Session.batch_id == batch.id, is_latest_attempt())
            .group_by(Session.state)
        ).all()
    )
    return {
        "event": "batch_finished",
        "batch_id": str(batch.id),
        "counts": counts,
        "finished_at": iso(batch.finished_at),
    }


def _owe(db: DbSession, batch: Batch, payload: dict[str, Any]) -> None:
    assert batch.callback_url is not None
    db.add(CallbackEvent(batch_id=batch.id, url=batch.callback_url, payload=payload, next_attempt_at=db_clock.now(db)))


def record_session_events(db: DbSession, session_id: uuid.UUID, batch_finished: bool) -> None:
    """Inside the terminal transaction of a session whose sample just settled (its feed position assigned): owe
    the events its end completes, if its batch has a callback URL."""
    row = db.execute(
        sa.select(Session, Task, Batch)
        .join(Task, Task.id == Session.task_pk)
        .join(Batch, Batch.id == Session.batch_id)
        .where(Session.id == session_id)
    ).first()
    if row is None or not row.Batch.callback_url:
        return
    session, task, batch = row
    if (event := _group_event(db, session, task)) is not None:
        _owe(db, batch, event)
    if batch_finished:
        db.refresh(batch)  # finished_at as stamped in this transaction
        _owe(db, batch, batch_event(db, batch))


def record_batch_finished(db: DbSession, batch_id: uuid.UUID) -> None:
    """Inside the transaction that finished a batch some other way (a cancel): owe its batch event."""
    batch = db.get(Batch, batch_id)
    if batch is not None and batch.callback_url:
        db.refresh(batch)
        _owe(db, batch, batch_event(db, batch))


@dataclass(frozen=True)
class _Due:
    id: int
    url: str
    payload: dict[str, Any]
    attempts: int


def _pause_s(attempts: int) -> float:
    return min(MAX_PAUSE_S, 2.0**attempts)


def _take_due(services: Services, limit: int) -> list[_Due]:
    """Claim up to ``limit`` events that are due: their next try is pushed back before they are sent, so another
    delivery loop (or this one, after a crash mid-POST) only tries them again after the pause."""
    with services.db.unit() as db:
        rows = db.scalars(
            sa.select(CallbackEvent)
            .where(
                CallbackEvent.delivered_at.is_(None),
                CallbackEvent.failed_at.is_(None),
                CallbackEvent.next_attempt_at <= db_clock.now(db),
            )
            .order_by(CallbackEvent.next_attempt_at, CallbackEvent.id)
            .limit(limit)
            .with_for_update(skip_locked=True)
        ).all()
        taken = []
        for row in rows:
            row.attempts += 1
            row.next_attempt_at = db_clock.shifted(db, _pause_s(row.attempts))
            taken.append(_Due(row.id, row.url, dict(row.payload), row.attempts))
    return taken


def _pinned(url: str, target: Target) -> tuple[str, dict[str, str], dict[str, Any]]:
    """``url`` sent to ``target.address``: the URL's own host in the Host header and for TLS."""
    parsed = httpx.URL(url)
    headers = {"Host": parsed.netloc.decode("ascii")}
    return str(parsed.copy_with(host=target.address)), headers, {"sni_hostname": target.host}


def _post(url: str, payload: dict[str, Any], allow: Sequence[str]) -> str | None:
    """One POST, to an address the URL may reach (checked now, against what its host resolves to now), with no
    redirects followed and no environment proxy; None once the receiver answered 2xx, else what went wrong."""
    try:
        targets = resolve_target(url, allow)
    except CallbackRefused as exc:
        return f"refused: {exc}"
    error = "no address"
    for target in targets:
        pinned, headers, extensions = _pinned(url, target)
        try:
            with httpx.Client(timeout=TIMEOUT_S, follow_redirects=False, trust_env=False) as client:
                response = client.post(pinned, json=payload, headers=headers, extensions=extensions)
        except httpx.ConnectError as exc:
            error = f"ConnectError: {exc}"
            continue  # another checked address of the same name may answer
        except httpx.HTTPError as exc:
            return f"{type(exc).__name__}: {exc}"
        return None if response.is_success else f"answered {response.status_code}"
    return error


def deliver_due(services: Services, limit: int = BATCH) -> int:
    """One delivery pass: POST the events that are due; returns how many the receivers accepted."""
    delivered = 0
    for due in _take_due(services, limit):
        error = _post(due.url, due.payload, services.config.callback_allow)
        with services.db.unit() as db:
            values: dict[str, Any]
            if error is None:
                values = {"delivered_at": db_clock.now(db), "last_error": None}
                delivered += 1
            else:
                log.warning("callback %s to %s failed (try %d): %s", due.id, shown_url(due.url), due.attempts, error)
                values = {"last_error": error[:1000]}
                if due.attempts >= MAX_ATTEMPTS:
                    values["failed_at"] = db_clock.now(db)
            db.execute(sa.update(CallbackEvent).where(CallbackEvent.id == due.id).values(**values))
    return delivered
