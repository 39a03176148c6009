"""How the domain hands a session to a stage queue, without knowing the queue technology (Celery in ``workers/``)."""

from __future__ import annotations

import uuid
from enum import StrEnum
from typing import Protocol


class Stage(StrEnum):
    INIT = "init"
    READY = "ready"
    RUN = "run"
    POSTRUN = "postrun"


class Dispatcher(Protocol):
    def send(self, stage: Stage, session_id: uuid.UUID) -> None:
        """Queue ``stage`` for ``session_id``. Called only after the transaction that made it due has committed."""
