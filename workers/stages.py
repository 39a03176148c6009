"""One thin task per stage: an id in, one call into ``polar.stages``."""

from __future__ import annotations

import uuid

from celery import Task

from polar.lifecycle.dispatch import Stage
from polar.stages.init import init_session
from polar.stages.postrun import postrun_session
from polar.stages.ready import ready_session
from polar.stages.run import run_session
from workers.app import TASK_NAMES, celery_app
from workers.context import services_for


@celery_app.task(name=TASK_NAMES[Stage.INIT], bind=True)
def init(self: Task, session_id: str) -> None:
    init_session(services_for(self.request.hostname), uuid.UUID(session_id))


@celery_app.task(name=TASK_NAMES[Stage.READY], bind=True)
def ready(self: Task, session_id: str) -> None:
    ready_session(services_for(self.request.hostname), uuid.UUID(session_id))


@celery_app.task(name=TASK_NAMES[Stage.RUN], bind=True)
def run(self: Task, session_id: str) -> None:
    run_session(services_for(self.request.hostname), uuid.UUID(session_id))


@celery_app.task(name=TASK_NAMES[Stage.POSTRUN], bind=True)
def postrun(self: Task, session_id: str) -> None:
    postrun_session(services_for(self.request.hostname), uuid.UUID(session_id))
