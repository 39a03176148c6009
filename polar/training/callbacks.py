"""Telling a trainer that data is ready: a batch's ``callback_url`` gets a POST when each group (all n samples
of a task) has finished and when the whole batch has.

    {"event": "group_finished", "batch_id", "group_id", "task_id", "feed_position", "sessions": [...]}
    {"event": "batch_finished", "batch_id", "counts": {state: n}, "finished_at"}

A group's sessions and the batch's counts are each sample's latest attempt (``polar.lifecycle.attempts``).

Events are sent after postrun's commit by the postrun that ended the group's (or batch's) last session; a
group event is best-effort, a batch event is retried by the reconciler until the receiver answers 2xx.
"""

from __future__ import annotations

import logging
import time
import uuid
from datetime import timedelta
from typing import Any

import httpx
import sqlalchemy as sa

from polar.clock import iso, utcnow
from polar.lifecycle.attempts import is_latest_attempt
from polar.lifecycle.groups import group_id
from polar.services import Services
from polar.storage.models import Batch, Session, Task

log = logging.getLogger(__name__)

ATTEMPTS = 3
TIMEOUT_S = 5.0


def post(url: str, payload: dict[str, Any]) -> bool:
    """POST ``payload``; True once the receiver answered 2xx (a few attempts with back-off)."""
    for attempt in range(ATTEMPTS):
        try:
            if httpx.post(url, json=payload, timeout=TIMEOUT_S).is_success:
                return True
        except httpx.HTTPError as exc:
            log.warning("callback to %s failed: %s", url, exc)
        time.sleep(0.2 * 2**attempt)
    return False


def _group_event(db: Any, session: Session, task: Task) -> dict[str, Any] | None:
    members = db.execute(
        sa.select(
            Session.id, Session.sample_index, Session.attempt, Session.state, Session.reward, Session.feed_seq,
            Session.outcome_class,
        )
        .where(Session.task_pk == session.task_pk, is_latest_attempt())
        .order_by(Session.sample_index)
    ).all()  # fmt: skip
    finished = [m for m in members if m.feed_seq is not None]
    # Only the postrun that ended the group's last session speaks for it.
    if len(finished) < task.num_samples or max(m.feed_seq for m in finished) != session.feed_seq:
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
                "reward": m.reward,
                "outcome_class": m.outcome_class,
            }
            for m in members
        ],
    }


def deliver_batch_finished(services: Services, batch_id: uuid.UUID) -> bool:
    with services.db.unit() as db:
        batch = db.get(Batch, batch_id)
        if batch is None or not batch.callback_url or batch.finished_at is None or batch.callback_sent_at:
            return False
        counts = dict(
            db.execute(
                sa.select(Session.state, sa.func.count())
                .where(Session.batch_id == batch_id, is_latest_attempt())
                .group_by(Session.state)
            ).all()
        )
        url = batch.callback_url
        payload = {"event": "batch_finished", "batch_id": str(batch_id), "counts": counts,
                   "finished_at": iso(batch.finished_at)}  # fmt: skip
    if not post(url, payload):
        return False
    with services.db.unit() as db:
        db.execute(
            sa.update(Batch)
            .where(Batch.id == batch_id, Batch.callback_sent_at.is_(None))
            .values(callback_sent_at=utcnow())
        )
    return True


def after_session_ended(services: Services, session_id: uuid.UUID) -> None:
    """Send the events this session's end completes, if its batch has a callback URL."""
    with services.db.unit() as db:
        row = db.execute(
            sa.select(Session, Task, Batch.callback_url, Batch.finished_at)
            .join(Task, Task.id == Session.task_pk)
            .join(Batch, Batch.id == Session.batch_id)
            .where(Session.id == session_id)
        ).first()
        if row is None or not row.callback_url:
            return
        session, task, url, finished_at = row
        event = _group_event(db, session, task)
        last_in_batch = finished_at is not None and session.feed_seq == db.scalar(
            sa.select(sa.func.max(Session.feed_seq)).where(Session.batch_id == session.batch_id)
        )
    if event is not None:
        post(url, event)
    if last_in_batch:
        deliver_batch_finished(services, session.batch_id)


def undelivered_batches(services: Services, older_than_s: float) -> list[uuid.UUID]:
    """Finished batches whose batch-finished event has not got through (for the reconciler to retry)."""
    cutoff = utcnow() - timedelta(seconds=older_than_s)
    with services.db.unit() as db:
        return list(
            db.scalars(
                sa.select(Batch.id).where(
                    Batch.callback_url.is_not(None), Batch.finished_at < cutoff, Batch.callback_sent_at.is_(None)
                )
            )
        )
