"""Runs the reconciler in every worker process's background, so no extra service is needed to recover lost
sessions. Each tick stamps this worker's node as alive; the process whose stamp finds the node unstamped for most
of an interval runs the pass, so a node's processes share one pass per interval (and an advisory lock keeps
passes of different nodes from overlapping). The worker announces its node once before it starts consuming,
too."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

from celery.signals import worker_ready

from polar.lifecycle.nodes import announce
from polar.runtimes.work_root import project_above, swappable_part
from polar.stages.reconciler import LeaseJudge, reconcile
from workers.context import services_for

log = logging.getLogger(__name__)


def _loop(worker: str) -> None:
    services = services_for(f"reconciler@{worker}")
    stop = threading.Event()
    # Leases are judged only after a stale window of prompt passes: never right after an outage or a pause.
    judge = LeaseJudge(services.config.stale_after_s)
    tick_s = services.config.reconcile_tick_s
    while not stop.wait(tick_s):
        try:
            # Three quarters of the tick: the process that ran the last pass finds the stamp old enough at its
            # next tick, so the node's passes stay about one tick apart.
            done = reconcile(services, judge, every_s=tick_s * 0.75)
            if any(v for k, v in done.items() if k not in {"admitted", "unsent_sent"}):
                log.warning("reconciler: %s", dict(done))
        except Exception:
            log.exception("reconciler pass failed")


def _check_run_slots(consumer: Any, run_concurrency: int) -> None:
    """The reconciler counts a node's run slots as ``POLAR_RUN_CONCURRENCY``: say so when a run worker's own
    ``--concurrency`` differs (too many slots announced: idle-looking nodes and needless re-sends)."""
    queues = {str(name) for name in consumer.app.amqp.queues.consume_from}
    concurrency = getattr(getattr(consumer, "controller", None), "concurrency", None)
    if "run" in queues and concurrency is not None and concurrency != run_concurrency:
        log.warning(
            "this run worker has --concurrency %s but POLAR_RUN_CONCURRENCY is %s: set them equal", concurrency,
            run_concurrency,
        )  # fmt: skip


def _check_work_root(work_root: str) -> None:
    problem = swappable_part(Path(work_root))
    if problem is not None:  # said at start; each session directory is refused until it is fixed
        log.error("POLAR_WORK_ROOT %s: %s, so another user could swap session directories: every session here "
                  "will fail to start until it is fixed", work_root, problem)  # fmt: skip
    found = project_above(Path(work_root))
    if found is not None:
        log.warning(
            "POLAR_WORK_ROOT %s is inside a project (%s has %s): commands in sessions will see its configuration "
            "(pytest settings, git, ...); choose a directory outside any project", work_root, *found,
        )  # fmt: skip


def _start(sender: Any = None, **_: Any) -> None:
    name = getattr(sender, "hostname", None) or "worker"
    services = services_for(f"reconciler@{name}")
    if sender is not None:
        _check_run_slots(sender, services.config.run_concurrency)
    _check_work_root(services.config.work_root)
    try:
        announce(services)
    except Exception:
        log.exception("could not announce this node; the reconciler will retry")
    threading.Thread(target=_loop, args=(name,), name="polar-reconciler", daemon=True).start()


# The worker's main process runs the loop, whatever its pool.
worker_ready.connect(_start, weak=False)
