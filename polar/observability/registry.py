"""Where a process's metrics live and how they are exposed, in one process or in several.

The API and the proxy run as several gunicorn worker processes, a Celery worker may run a prefork pool: a scrape
must see the sum over all of them, not the one process that happened to answer. ``prometheus_client`` does that in
its multiprocess mode: every process writes its values to memory-mapped files in one directory, and a scrape
merges the files. Each Polar *process group* (one gunicorn master and its workers, one Celery worker and its pool)
gets a directory of its own under ``POLAR_METRICS_DIR`` (default ``<state dir>/metrics``), named for the service,
its port and the host, emptied when the group starts:

    path = use_directory(group_dir(config, "proxy", 8100), clean=True)   # in the gunicorn master, before forking
    body, content_type = exposition(own_registry)                       # in whichever process answers /metrics

Without a directory (a Flask app made in a test, a worker with no metrics port) a process keeps its values in
memory and exposes only its own. Gauges of the in-flight kind are summed over live processes (``livesum``);
files left by processes that died are dropped from them at every scrape.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import socket
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, values
from prometheus_client.exposition import choose_encoder, start_http_server
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

from polar.config import Config

log = logging.getLogger(__name__)

# prometheus_client reads this variable; Polar sets it per process group (``use_directory``).
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
_LIVE_FILE = re.compile(r"gauge_live\w+_(\d+)\.db")


class Collector(Protocol):
    def collect(self) -> Iterable[Metric]: ...


def group_dir(config: Config, service: str, port: int | str) -> Path:
    """The metrics directory of one process group: ``<POLAR_METRICS_DIR>/<service>-<port>.<host name>``. Two
    groups of one machine never share a port, and the host name keeps containers apart even when their
    ``POLAR_METRICS_DIR`` is on a shared volume (a group must never read another's files: process ids of another
    machine or container say nothing here)."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", f"{service}-{port}.{socket.gethostname()}")
    return Path(config.metrics_dir) / name


def use_directory(path: Path, clean: bool) -> Path:
    """Make this process (and every process it forks from now on) write its metrics to ``path``; with ``clean``,
    first remove what an earlier run of the group left. Call it before any metric is created."""
    path.mkdir(parents=True, exist_ok=True)
    if clean:
        for stale in path.glob("*.db"):
            stale.unlink(missing_ok=True)
    os.environ[MULTIPROC_ENV] = str(path)
    # prometheus_client picks its value store once, when it is first imported; a process that imported it before
    # the directory was known must switch now, before its first metric (metrics made earlier stay in memory).
    if not getattr(values.ValueClass, "_multiprocess", False):
        values.ValueClass = values.MultiProcessValue()  # type: ignore[no-untyped-call]
    return path


def drop_directory(path: Path) -> None:
    """The process group of ``path`` (its ``group_dir``) is ending: remove the directory, whose values mean nothing
    without the group."""
    shutil.rmtree(path, ignore_errors=True)


def multiprocess_dir() -> Path | None:
    """The directory this process writes its metrics to, or None when they stay in its memory."""
    path = os.environ.get(MULTIPROC_ENV)
    return Path(path) if path and getattr(values.ValueClass, "_multiprocess", False) else None


def forget_process(pid: int, path: Path | None = None) -> None:
    """A process of the group has exited: its in-flight gauges stop counting (its counters stay)."""
    path = path or multiprocess_dir()
    if path is not None:
        mark_process_dead(pid, str(path))  # type: ignore[no-untyped-call]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _forget_dead(path: Path) -> None:
    """Drop the live-gauge files of processes that are gone (killed without a word: SIGKILL, OOM)."""
    for name in os.listdir(path):
        match = _LIVE_FILE.fullmatch(name)
        if match and not _alive(int(match.group(1))):
            forget_process(int(match.group(1)), path)


@dataclass(frozen=True)
class _Files:
    """The merged metrics of every process that wrote to ``path``."""

    path: Path

    def collect(self) -> Iterator[Metric]:
        _forget_dead(self.path)
        yield from MultiProcessCollector(None, str(self.path)).collect()  # type: ignore[no-untyped-call]


@dataclass(frozen=True)
class Exposition:
    """Several collectors as one, for ``generate_latest``: what one scrape shows."""

    sources: tuple[Collector, ...]

    def collect(self) -> Iterator[Metric]:
        for source in self.sources:
            yield from source.collect()


def scrape_sources(own: CollectorRegistry, *extra: Collector) -> Exposition:
    """What a scrape of this process shows: the whole group's files (multiprocess) or this process's ``own``
    registry, then ``extra`` collectors (values computed at scrape time, never stored in files)."""
    path = multiprocess_dir()
    base: Collector = _Files(path) if path is not None else own
    return Exposition((base, *extra))


def exposition(own: CollectorRegistry, *extra: Collector) -> tuple[bytes, str]:
    """``scrape_sources(own, *extra)`` in the classic text format (what every Prometheus reads), and its content
    type."""
    encoder, content_type = choose_encoder("")
    return encoder(scrape_sources(own, *extra)), content_type


def serve(host: str, port: int, own: CollectorRegistry) -> WSGIServer:
    """Answer every GET on ``host:port`` with this process group's metrics, from a daemon thread (a Celery worker
    has no web app of its own). Returns the server; ``shutdown()`` stops it."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(scrape_sources(own))
    server, _ = start_http_server(port, host, registry)
    return server
