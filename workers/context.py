"""The per-process ``Services`` a worker's tasks share (built on first use, after the pool has forked)."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from celery.signals import worker_process_init

from polar.config import load_config
from polar.services import Services
from polar.storage.database import open_database
from workers.app import celery_app
from workers.dispatch import CeleryDispatcher


@functools.cache
def _process_services() -> Services:
    config = load_config()
    return Services(config, open_database(config, "worker"), CeleryDispatcher(celery_app), "worker")


def services_for(worker: str | None) -> Services:
    """This process's services, naming ``worker`` (the Celery node name) in session events."""
    return dataclasses.replace(_process_services(), worker=worker or "worker")


@worker_process_init.connect(weak=False)
def _forget_parent_connections(**_: Any) -> None:
    # A forked pool process must not reuse (or close) the parent's database connections.
    if _process_services.cache_info().currsize:
        _process_services().db.engine.dispose(close=False)
