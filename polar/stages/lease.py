"""A stage's hold on a session: claimed by compare-and-set with a fresh lease token, kept alive by a heartbeat.

A claim succeeds only when nobody holds a live lease, so a redelivered or duplicated task message finds the
session taken and does nothing; a worker that dies stops heartbeating and the reconciler hands the session on.
The token (``sessions.lease``) tells two holders apart even on one worker (threads, processes, a stalled one
that lost its lease to another): the heartbeat and every transition the holder makes check it, so a stale holder
changes nothing. Heartbeats, staleness and the budget are all on the database's clock.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from polar.contract.states import BUFFERED, State
from polar.contract.task_request import TaskRequest, task_from_json
from polar.lifecycle.nodes import is_drained
from polar.services import Services
from polar.storage import db_clock
from polar.storage.locks import ADMISSION, exclusive
from polar.storage.models import Batch, Session, Task


@dataclass(frozen=True)
class Claimed:
    session: Session
    task: TaskRequest
    lease: uuid.UUID | None = None
    # Seconds of budget left when the row was read (the database's clock), and when that was (this process's).
    _remaining_at_load: float | None = None
    _loaded: float = field(default_factory=time.monotonic)

    @property
    def remaining_s(self) -> float:
        if self._remaining_at_load is None:
            return float("inf")
        return self._remaining_at_load - (time.monotonic() - self._loaded)

    @property
    def held(self) -> sa.ColumnElement[bool]:
        """The condition every transition by this holder adds: the lease is still ours."""
        return Session.lease == self.lease


class NodeFull(Exception):
    """This node already holds its READY bound of sessions in init and ready; another node should take it."""


def load(services: Services, session_id: uuid.UUID, lease: uuid.UUID | None = None) -> Claimed | None:
    with services.db.unit() as db:
        remaining = db_clock.seconds_until(db, Session.deadline_at)
        row = db.execute(
            sa.select(Session, Task.spec, remaining)
            .join(Task, Task.id == Session.task_pk)
            .where(Session.id == session_id)
        ).first()
    if row is None:
        return None
    return Claimed(row[0], task_from_json(row[1]), lease, None if row[2] is None else float(row[2]))


def _node_full(db: Any, services: Services, session_id: uuid.UUID) -> bool:
    """Whether this node has no room for one more session: its READY bound is held, or it is drained."""
    exclusive(db, ADMISSION)  # the same lock admission takes, so the two never overshoot together
    if is_drained(db, services.config.node):
        return True
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


def claim(
    services: Services, session_id: uuid.UUID, state: State, *, take_node: bool = False, **values: Any
) -> Claimed | None:
    """Take the session with a new lease if it is in ``state`` and nobody holds a live lease on it (``values``
    are set in the same UPDATE).

    ``take_node`` (init): the session's runtime will live on this node, so it becomes the session's ``node``,
    provided the node has room in its READY bound; ``NodeFull`` otherwise."""
    lease = uuid.uuid4()
    if take_node:
        values["node"] = services.config.node
    with services.db.unit() as db:
        if take_node and _node_full(db, services, session_id):
            raise NodeFull(services.config.node)
        stale = db_clock.ago(db, services.config.stale_after_s)
        taken = db.execute(
            sa.update(Session)
            .where(
                Session.id == session_id,
                Session.state == state.value,
                sa.or_(Session.heartbeat_at.is_(None), Session.heartbeat_at < stale),
            )
            .values(heartbeat_at=db_clock.now(db), lease=lease, worker=services.worker, **values)
            .returning(Session.id)
        ).first()
    return load(services, session_id, lease) if taken else None


# Whether a session is to stop: its batch cancelled, or its group stopped early (polar.stages.early_stop).
_CANCELLED = sa.or_(
    sa.select(Batch.cancel_requested_at.is_not(None)).where(Batch.id == Session.batch_id).scalar_subquery(),
    sa.select(Task.stopped_at.is_not(None)).where(Task.id == Session.task_pk).scalar_subquery(),
)


def cancelled_now(services: Services, session_id: uuid.UUID) -> bool:
    """Whether the session's batch has been cancelled or its group stopped early."""
    with services.db.unit() as db:
        return bool(db.scalar(sa.select(_CANCELLED).where(Session.id == session_id)))


def _beat(services: Services, session_id: uuid.UUID, lease: uuid.UUID) -> tuple[bool, bool]:
    """Refresh the lease: (still ours, the session's batch has been cancelled or its group stopped meanwhile)."""
    with services.db.unit() as db:
        row = db.execute(
            sa.update(Session)
            .where(Session.id == session_id, Session.lease == lease)
            .values(heartbeat_at=db_clock.now(db))
            .returning(_CANCELLED)
        ).first()
    return (row is not None, bool(row and row[0]))


@contextmanager
def heartbeat(
    services: Services,
    session_id: uuid.UUID,
    lease: uuid.UUID | None,
    on_cancel: Callable[[], None] | None = None,
    on_lost: Callable[[], None] | None = None,
    on_beat: Callable[[], None] | None = None,
) -> Iterator[None]:
    """Refresh the lease every ``heartbeat_interval_s`` while the body runs; call ``on_cancel`` (once) when the
    session's batch is cancelled or its group stopped early, and ``on_lost`` (once) when the lease has gone to
    another holder (or the session moved on without us), so a long stage can stop its work; ``on_beat`` after each
    beat that found the lease still ours (the run re-reads its budget there)."""
    stop = threading.Event()

    def beat() -> None:
        cancel_told = lost_told = False
        while not stop.wait(services.config.heartbeat_interval_s):
            try:
                ours, cancelled = _beat(services, session_id, lease) if lease else (True, False)
                if ours and on_beat is not None:
                    on_beat()
            except Exception:  # a missed beat is retried; the reconciler tolerates a few
                continue
            if cancelled and on_cancel is not None and not cancel_told:
                cancel_told = True
                on_cancel()
            if not ours and on_lost is not None and not lost_told:
                lost_told = True
                on_lost()

    thread = threading.Thread(target=beat, name=f"heartbeat-{session_id}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
