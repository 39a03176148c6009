"""A throwaway deployment for a benchmark: a fresh migrated Postgres database (``POLAR_BENCH_ADMIN_DSN``, default
the local ``test`` database), an emptied Redis database (``POLAR_BENCH_REDIS`` + ``/<db>``), free ports and the
environment every process of the stack shares. Both are removed afterwards."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import redis

from polar.local.launcher import free_port, pipeline_env
from polar.storage.migration import upgrade
from polar.storage.scratch import create_database, drop_database

ADMIN_DSN = os.environ.get("POLAR_BENCH_ADMIN_DSN", "postgresql://postgres@127.0.0.1:5432/test")
REDIS_BASE = os.environ.get("POLAR_BENCH_REDIS", "redis://127.0.0.1:6379")


@dataclass(frozen=True)
class Deployment:
    database_url: str
    ports: dict[str, int]  # engine, api, proxy
    env: dict[str, str]
    tmp: Path  # state, sessions and logs live under it


def _flush(broker_url: str) -> None:
    client = redis.Redis.from_url(broker_url)
    try:
        client.flushdb()
    finally:
        client.close()


@contextmanager
def scratch_deployment(
    name: str, redis_db: int, run_concurrency: int, env: Mapping[str, str] | None = None
) -> Iterator[Deployment]:
    """Database, broker, ports and environment for one run of bench ``name``; ``env`` is added to the shared one."""
    tmp = Path(tempfile.mkdtemp(prefix=f"polar-bench-{name}-"))
    broker_url = f"{REDIS_BASE}/{redis_db}"
    database_url = create_database(ADMIN_DSN, "polar_bench")
    try:
        upgrade(database_url)
        _flush(broker_url)
        ports = {"engine": free_port(), "api": free_port(), "proxy": free_port()}
        shared = pipeline_env(database_url, broker_url, ports, tmp / "state", run_concurrency, tmp / "sessions")
        yield Deployment(database_url, ports, {**shared, **(env or {})}, tmp)
    finally:
        drop_database(ADMIN_DSN, database_url)
        _flush(broker_url)
