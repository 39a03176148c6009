"""What a stage function needs from its process: configuration, the database, a dispatcher, its own name."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import sqlalchemy as sa

from polar.clock import utcnow
from polar.config import Config
from polar.lifecycle.dispatch import Dispatcher, Stage
from polar.storage.database import Database
from polar.storage.models import Session


@dataclass(frozen=True)
class Services:
    config: Config
    db: Database
    dispatcher: Dispatcher
    worker: str

    def dispatch(self, stage: Stage, session_id: uuid.UUID, *, pinned: bool = True) -> None:
        """Queue ``stage`` and remember when, so the reconciler can tell a lost message from a queued one.

        Every stage after ``init`` goes to the queue of the node that ran the session's init (``pinned``); the
        reconciler unpins a lost node's sessions so a surviving node can finish them."""
        with self.db.unit() as db:
            node = db.scalar(
                sa.update(Session)
                .where(Session.id == session_id)
                .values(stage_enqueued_at=utcnow())
                .returning(Session.node)
            )
        self.dispatcher.send(stage, session_id, node if pinned and stage is not Stage.INIT else None)
