"""gunicorn settings for Polar's two apps, so their ``/metrics`` add up every worker process:

    gunicorn -c python:web.gunicorn_conf --bind 0.0.0.0:8100 --workers 2 -k web.gunicorn_worker.EpollWorker \
        'web.proxy:create_app()'

Before forking, the master gives its process group a metrics directory of its own
(``<POLAR_METRICS_DIR>/<app>-<port>.<host>``, emptied: counters start again with the master) that every worker
writes to; when a worker exits, its in-flight gauges stop counting; when the master exits, the directory goes.
Without this file each worker would answer a scrape with its own numbers only. ``--preload`` must not be used
with it: the app would make its metrics before the directory is set.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from polar.config import load_config
from polar.observability import drop_directory, forget_process, group_dir, use_directory

log = logging.getLogger("gunicorn.error")


def _group(server: Any) -> tuple[str, str]:
    """(app, port) of this master: ``web.proxy:create_app()`` bound to ``0.0.0.0:8100`` → ("proxy", "8100")."""
    app = getattr(server.app, "app_uri", None) or server.cfg.wsgi_app or "app"
    binds = server.cfg.bind or ["unbound"]
    return app.partition(":")[0].rsplit(".", 1)[-1], binds[0].rpartition(":")[2]


def _directory(server: Any) -> Path:
    service, port = _group(server)
    return group_dir(load_config(), service, port)


def on_starting(server: Any) -> None:
    try:
        path = use_directory(_directory(server), clean=True)
    except OSError as exc:  # metrics are not worth refusing to serve: each worker then reports its own
        log.warning("metrics: no multiprocess directory (%s); /metrics shows one worker's numbers", exc)
        return
    log.info("metrics: workers write to %s", path)


def child_exit(server: Any, worker: Any) -> None:
    forget_process(worker.pid)


def on_exit(server: Any) -> None:
    drop_directory(_directory(server))
