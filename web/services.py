"""Building the domain ``Services`` for a web process (Celery is only used to send stage messages)."""

from __future__ import annotations

import os
import socket

from polar.config import Config
from polar.services import Services
from polar.storage.database import open_database


def web_services(config: Config, role: str) -> Services:
    from workers.app import create_celery
    from workers.dispatch import CeleryDispatcher

    return Services(
        config=config,
        db=open_database(config, role),
        dispatcher=CeleryDispatcher(create_celery(config)),
        worker=f"{role}@{socket.gethostname()}:{os.getpid()}",
    )
