"""How the domain hands a session to a stage queue, without knowing the queue technology (Celery in ``workers/``).

``init`` is shared by every node. After init, a session's runtime lives on the node that ran it, so its
``ready``, ``run`` and ``postrun`` messages go to that node's own queue (``run.<node>``), consumed only by that
node's workers. A lost node's sessions are finished from the shared ``postrun`` queue (``polar.lifecycle.nodes``).
"""

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
    def send(self, stage: Stage, session_id: uuid.UUID, node: str | None = None) -> None:
        """Queue ``stage`` for ``session_id`` on ``node``'s queue (None: the shared one). Called only after the
        transaction that made it due has committed."""
