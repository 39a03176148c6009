"""A Celery worker's stage metrics (docs/metrics.md): every stage task timed and counted by
``polar.observability.StageMetrics``, served on ``POLAR_WORKER_METRICS_PORT`` (unset or 0: not served).

The worker's main process makes the group's metrics directory (``<POLAR_METRICS_DIR>/worker-<port>.<host>``, emptied)
before its pool starts and serves the merged files from a thread; pool processes (prefork) or threads write to it.
Several workers on one machine each need a port of their own.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from celery.signals import worker_init, worker_process_shutdown, worker_shutdown

from polar.config import load_config
from polar.contract.dispatch import Stage
from polar.observability import StageMetrics, drop_directory, forget_process, group_dir, serve, use_directory
from polar.services import Services

log = logging.getLogger(__name__)


@functools.cache
def stage_metrics() -> StageMetrics:
    """This process's stage metrics (made on first use: after the metrics directory is set)."""
    return StageMetrics()


@contextmanager
def observed(services: Services, stage: Stage) -> Iterator[None]:
    """Time and count the ``with`` block as one task of ``stage`` on this worker's node."""
    with stage_metrics().task(stage.value, services.config.node):
        yield


@worker_init.connect(weak=False)
def _serve(sender: Any = None, **_: Any) -> None:
    config = load_config()
    port = config.worker_metrics_port
    if not port:
        return
    try:
        use_directory(group_dir(config, "worker", port), clean=True)
        serve(config.worker_metrics_host, port, stage_metrics().registry)
    except OSError as exc:  # metrics are not worth a worker that does not start
        log.error("metrics: cannot serve on %s:%s (%s); this worker's metrics are not exposed",
                  config.worker_metrics_host, port, exc)  # fmt: skip
        return
    log.info("metrics: serving stage metrics on http://%s:%s/metrics", config.worker_metrics_host, port)


@worker_process_shutdown.connect(weak=False)
def _forget(**_: Any) -> None:
    # A pool process leaving: its in-progress gauge stops counting (one killed outright is dropped at a scrape).
    forget_process(os.getpid())


@worker_shutdown.connect(weak=False)
def _drop(**_: Any) -> None:
    config = load_config()
    if config.worker_metrics_port:  # the worker is leaving: its group's files with it
        drop_directory(group_dir(config, "worker", config.worker_metrics_port))
