"""The domain's ``Dispatcher`` on top of Celery: a stage becomes a message on that stage's queue."""

from __future__ import annotations

import uuid

from celery import Celery

from polar.lifecycle.dispatch import Stage
from workers.app import TASK_NAMES


class CeleryDispatcher:
    def __init__(self, app: Celery) -> None:
        self._app = app

    def send(self, stage: Stage, session_id: uuid.UUID) -> None:
        self._app.send_task(TASK_NAMES[stage], args=[str(session_id)], queue=stage.value)
