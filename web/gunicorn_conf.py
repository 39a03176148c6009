"""gunicorn settings for Polar's two apps, so their ``/metrics`` add up every worker process:

    gunicorn -c python:web.gunicorn_conf --bind 0.0.0.0:8100 --workers 2 -k web.gunicorn_worker.EpollWorker \
        'web.proxy:create_app()'

Before forking, the master gives its process group a metrics directory of its own
(``<POLAR_METRICS_DIR>/<app>-<port>.<host>``, emptied: counters start again with the master) that every worker
writes to; when a worker exits, its in-flight gauges stop counting; when the master exits, the directory goes.
Without this file each worker would answer a scrape with its own numbers only. ``--preload`` must not be used
with it: the app would make its metrics before the directory is set.

gunicorn 25.1 and later give every master the same control socket by default (``$HOME/.gunicorn/gunicorn.ctl``):
the API and the proxy, and every stack of a machine, would bind it in turn, and the first to stop would unlink the
socket of another. Unless one is configured, each master's goes in its metrics directory (``gunicornc -s
<dir>/gunicorn.ctl``).
"""

from __future__ import annotations

import logging
import os
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


# A Unix socket's path must fit sun_path (108 bytes with its terminating NUL).
SOCKET_PATH_MAX = 107


def _own_control_socket(server: Any, directory: Path) -> None:
    """The master's control socket in ``directory``, unless the operator named one or turned it off. Sandboxes bind
    neither this directory nor ``$HOME``, and the socket is the master's user's alone (gunicorn's mode 0600)."""
    setting = server.cfg.settings.get("control_socket")
    if setting is None or server.cfg.control_socket_disable or setting.value != setting.default:
        return  # a gunicorn without one, or the operator chose
    path = directory / "gunicorn.ctl"
    if len(os.fsencode(path)) > SOCKET_PATH_MAX:
        server.cfg.set("control_socket_disable", True)
        log.warning("control socket: %s is too long a path for a Unix socket; gunicornc cannot reach this master", path)
        return
    server.cfg.set("control_socket", str(path))


def on_starting(server: Any) -> None:
    directory = _directory(server)
    try:
        path = use_directory(directory, clean=True)
    except OSError as exc:  # metrics are not worth refusing to serve: each worker then reports its own
        log.warning("metrics: no multiprocess directory (%s); /metrics shows one worker's numbers", exc)
    else:
        log.info("metrics: workers write to %s", path)
    _own_control_socket(server, directory)


def child_exit(server: Any, worker: Any) -> None:
    forget_process(worker.pid)


def on_exit(server: Any) -> None:
    drop_directory(_directory(server))
