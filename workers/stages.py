"""One thin task per stage: an id in, one call into ``polar.stages``, timed and counted (``workers.metrics``)."""

from __future__ import annotations

import uuid
from collections.abc import Callable

from celery import Task

from polar.contract.dispatch import Stage
from polar.services import Services
from polar.stages.init import init_session
from polar.stages.postrun import postrun_session
from polar.stages.ready import ready_session
from polar.stages.run import run_session
from workers.app import TASK_NAMES, celery_app
from workers.context import services_for
from workers.metrics import observed


def _perform(task: Task, stage: Stage, step: Callable[[Services, uuid.UUID], None], session_id: str) -> None:
    services = services_for(task.request.hostname)
    with observed(services, stage):
        step(services, uuid.UUID(session_id))


@celery_app.task(name=TASK_NAMES[Stage.INIT], bind=True)
def init(self: Task, session_id: str) -> None:
    _perform(self, Stage.INIT, init_session, session_id)


@celery_app.task(name=TASK_NAMES[Stage.READY], bind=True)
def ready(self: Task, session_id: str) -> None:
    _perform(self, Stage.READY, ready_session, session_id)


@celery_app.task(name=TASK_NAMES[Stage.RUN], bind=True)
def run(self: Task, session_id: str) -> None:
    _perform(self, Stage.RUN, run_session, session_id)


@celery_app.task(name=TASK_NAMES[Stage.POSTRUN], bind=True)
def postrun(self: Task, session_id: str) -> None:
    _perform(self, Stage.POSTRUN, postrun_session, session_id)
