"""A stage task's hold on a session: claimed by compare-and-set, kept alive by a heartbeat.

A claim succeeds only when nobody holds a live lease, so a redelivered or duplicated task message finds the
session taken and does nothing; a worker that dies stops heartbeating and the reconciler hands the session on.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import sqlalchemy as sa

from polar.clock import as_utc, utcnow
from polar.lifecycle.states import BUFFERED, State
from polar.services import Services
from polar.storage.locks import ADMISSION, exclusive
from polar.storage.models import Batch, Session, Task
from polar.task_request import TaskRequest, task_from_json


@dataclass(frozen=True)
class Claimed:
    session: Session
    task: TaskRequest

    @property
    def remaining_s(self) -> float:
        deadline = as_utc(self.session.deadline_at)
        return (deadline - utcnow()).total_seconds() if deadline else float("inf")


def load(services: Services, session_id: uuid.UUID) -> Claimed | None:
    with services.db.unit() as db:
        row = db.execute(
            sa.select(Session, Task.spec).join(Task, Task.id == Session.task_pk).where(Session.id == session_id)
        ).first()
    if row is None:
        return None
    return Claimed(row[0], task_from_json(row[1]))


class NodeFull(Exception):
    """This node already holds its READY bound of sessions in init and ready; another node should take it."""


def _node_full(db: Any, services: Services, session_id: uuid.UUID) -> bool:
    exclusive(db, ADMISSION)  # the same lock admission takes, so the two never overshoot together
    held = db.scalar(
        sa.select(sa.func.count())
        .select_from(Session)
        .where(
            Session.node == services.config.node,
            Session.state.in_([s.value for s in BUFFERED]),
            Session.id != session_id,
        )
    )
    return int(held or 0) >= services.config.ready_buffer


def claim(services: Services, session_id: uuid.UUID, state: State, *, take_node: bool = False) -> Claimed | None:
    """Take the session if it is in ``state`` and nobody holds a live lease on it.

    ``take_node`` (init): the session's runtime will live on this node, so it becomes the session's ``node``,
    provided the node has room in its READY bound; ``NodeFull`` otherwise."""
    now = utcnow()
    stale = now - timedelta(seconds=services.config.stale_after_s)
    values: dict[str, Any] = {"heartbeat_at": now, "worker": services.worker}
    if take_node:
        values["node"] = services.config.node
    with services.db.unit() as db:
        if take_node and _node_full(db, services, session_id):
            raise NodeFull(services.config.node)
        taken = db.execute(
            sa.update(Session)
            .where(
                Session.id == session_id,
                Session.state == state.value,
                sa.or_(Session.heartbeat_at.is_(None), Session.heartbeat_at < stale),
            )
            .values(**values)
            .returning(Session.id)
        ).first()
    return load(services, session_id) if taken else None


def _beat(services: Services, session_id: uuid.UUID, state: State) -> bool:
    """Refresh the lease; True when the session's batch has been cancelled meanwhile."""
    cancelled = sa.select(Batch.cancel_requested_at.is_not(None)).where(Batch.id == Session.batch_id).scalar_subquery()
    with services.db.unit() as db:
        return bool(
            db.execute(
                sa.update(Session)
                .where(Session.id == session_id, Session.state == state.value, Session.worker == services.worker)
                .values(heartbeat_at=utcnow())
                .returning(cancelled)
            ).scalar()
        )


@contextmanager
def heartbeat(
    services: Services, session_id: uuid.UUID, state: State, on_cancel: Callable[[], None] | None = None
) -> Iterator[None]:
    """Refresh the lease every ``heartbeat_interval_s`` while the body runs; call ``on_cancel`` (once) when the
    session's batch is cancelled, so a long stage can stop its work."""
    stop = threading.Event()

    def beat() -> None:
        notified = False
        while not stop.wait(services.config.heartbeat_interval_s):
            try:
                cancelled = _beat(services, session_id, state)
            except Exception:  # a missed beat is retried; the reconciler tolerates a few
                continue
            if cancelled and on_cancel is not None and not notified:
                notified = True
                on_cancel()

    thread = threading.Thread(target=beat, name=f"heartbeat-{session_id}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
