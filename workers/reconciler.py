"""Runs the reconciler in every worker process's background, one pass per interval (an advisory lock keeps
concurrent passes from overlapping), so no extra service is needed to recover lost sessions."""

from __future__ import annotations

import logging
import threading
from typing import Any

from celery.signals import worker_ready

from polar.lifecycle.reconciler import reconcile
from workers.context import services_for

log = logging.getLogger(__name__)


def _loop(worker: str) -> None:
    services = services_for(f"reconciler@{worker}")
    stop = threading.Event()
    while not stop.wait(services.config.reconcile_interval_s):
        try:
            done = reconcile(services)
            if any(v for k, v in done.items() if k != "admitted"):
                log.warning("reconciler: %s", dict(done))
        except Exception:
            log.exception("reconciler pass failed")


def _start(sender: Any = None, **_: Any) -> None:
    name = getattr(sender, "hostname", None) or "worker"
    threading.Thread(target=_loop, args=(name,), name="polar-reconciler", daemon=True).start()


# The worker's main process runs the loop, whatever its pool.
worker_ready.connect(_start, weak=False)
