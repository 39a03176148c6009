"""Runs the reconciler in every worker process's background, one pass per interval (an advisory lock keeps
concurrent passes from overlapping), so no extra service is needed to recover lost sessions. Each pass also
says this worker's node is alive; the worker announces it once before it starts consuming, too."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from celery.signals import worker_ready

from polar.lifecycle.nodes import announce
from polar.lifecycle.reconciler import reconcile
from workers.context import services_for

log = logging.getLogger(__name__)


def _loop(worker: str) -> None:
    services = services_for(f"reconciler@{worker}")
    stop = threading.Event()
    # While the database was unreachable every heartbeat failed too: judge no lease until a stale window has
    # passed with the database back, or healthy runs would be declared lost.
    judge_after = 0.0
    while not stop.wait(services.config.reconcile_interval_s):
        try:
            done = reconcile(services, judge_leases=time.monotonic() >= judge_after)
            if any(v for k, v in done.items() if k != "admitted"):
                log.warning("reconciler: %s", dict(done))
        except Exception:
            log.exception("reconciler pass failed")
            judge_after = time.monotonic() + services.config.stale_after_s


def _start(sender: Any = None, **_: Any) -> None:
    name = getattr(sender, "hostname", None) or "worker"
    services = services_for(f"reconciler@{name}")
    try:
        announce(services)
    except Exception:
        log.exception("could not announce this node; the reconciler will retry")
    threading.Thread(target=_loop, args=(name,), name="polar-reconciler", daemon=True).start()


# The worker's main process runs the loop, whatever its pool.
worker_ready.connect(_start, weak=False)
