"""The domain's ``Dispatcher`` on top of Celery: a stage becomes a message on that stage's queue."""

from __future__ import annotations

import uuid

from celery import Celery
from kombu.exceptions import KombuError
from redis.exceptions import RedisError

from polar.contract.dispatch import Stage
from polar.errors import BrokerUnavailable
from workers.app import TASK_NAMES, stage_queue


class CeleryDispatcher:
    def __init__(self, app: Celery) -> None:
        self._app = app

    def send(self, stage: Stage, session_id: uuid.UUID, node: str | None = None) -> None:
        # The Queue itself (not its name): the producer declares it and its binding on first use, so a message
        # for a node whose workers have not started yet waits in that node's queue instead of being dropped.
        try:
            self._app.send_task(TASK_NAMES[stage], args=[str(session_id)], queue=stage_queue(stage, node))
        except (KombuError, RedisError, OSError) as exc:
            raise BrokerUnavailable(f"{type(exc).__name__}: {exc}") from exc
