"""Delivers batches' callback events (``polar.training.callbacks``) from a thread of every worker's main process,
once a second: off the stage tasks and the reconciler, so a receiver that never answers delays nothing else."""

from __future__ import annotations

import logging
import threading
from typing import Any

from celery.signals import worker_ready

from polar.training.callbacks import deliver_due
from workers.context import services_for

log = logging.getLogger(__name__)

INTERVAL_S = 1.0


def _loop(worker: str) -> None:
    services = services_for(f"callbacks@{worker}")
    stop = threading.Event()
    while not stop.wait(INTERVAL_S):
        try:
            deliver_due(services)
        except Exception:
            log.exception("callback delivery pass failed")


def _start(sender: Any = None, **_: Any) -> None:
    name = getattr(sender, "hostname", None) or "worker"
    threading.Thread(target=_loop, args=(name,), name="polar-callbacks", daemon=True).start()


worker_ready.connect(_start, weak=False)
