"""Connection pools sized from configuration: a process holds at most ``POLAR_DB_POOL_SIZE +
POLAR_DB_MAX_OVERFLOW`` connections, named for its role, even with many more threads wanting one; a connection idle
for a while is pinged before use, and replaced if dead."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psycopg
import pytest
import sqlalchemy as sa

from polar.config import load_config
from polar.storage import database
from polar.storage.database import open_database
from tests.live_proxy import live_proxy

POOL = {"POLAR_DB_POOL_SIZE": "2", "POLAR_DB_MAX_OVERFLOW": "1"}


def test_the_pool_follows_the_configuration(database_url: str, tmp_path: Path) -> None:
    config = load_config({"POLAR_DATABASE_URL": database_url, **POOL}, cwd=tmp_path)
    db = open_database(config, "api")
    try:
        assert (db.engine.pool.size(), db.engine.pool._max_overflow) == (2, 1)  # type: ignore[attr-defined]
        with db.engine.connect() as connection:
            assert connection.scalar(sa.text("SELECT current_setting('application_name')")) == "polar-api"
    finally:
        db.dispose()


def test_a_busy_proxy_stays_within_its_pool(database_url: str, tmp_path: Path) -> None:
    with live_proxy(database_url, tmp_path, policy="echo", env=POOL) as proxy:
        _, key = proxy.session()
        peak = 0
        done = threading.Event()

        def watch() -> None:
            nonlocal peak
            # Autocommit: pg_stat_activity is a snapshot per transaction.
            with proxy.services.db.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
                while not done.is_set():
                    # This test's database only: suites running beside it have proxies of their own.
                    count = connection.scalar(
                        sa.text(
                            "SELECT count(*) FROM pg_stat_activity "
                            "WHERE application_name = 'polar-proxy' AND datname = current_database()"
                        )
                    )
                    peak = max(peak, int(count or 0))
                    time.sleep(0.01)

        watcher = threading.Thread(target=watch)
        watcher.start()
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        with ThreadPoolExecutor(32) as pool:
            statuses = list(
                pool.map(
                    lambda _: httpx.post(f"{proxy.base(key)}/v1/chat/completions", json=body, timeout=60).status_code,
                    range(96),
                )
            )
        done.set()
        watcher.join()
    assert statuses == [200] * 96
    assert 0 < peak <= 2 * 3  # two gunicorn workers, each at most pool size + overflow


def test_an_idle_connection_is_pinged_and_a_dead_one_replaced(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A connection used within ``PING_IDLE_S`` is handed out as it is (no ping: that was a round trip on every
    model call); one idle longer is pinged first, and one whose backend died is replaced before anyone uses it.
    The window is set, not waited out: an hour while the connection is reused, then none."""
    monkeypatch.setattr(database, "PING_IDLE_S", 3600.0)
    db = database.Database(database_url, pool_size=1, max_overflow=0)
    pings = []
    ping = db.engine.dialect.do_ping
    monkeypatch.setattr(db.engine.dialect, "do_ping", lambda connection: pings.append(1) or ping(connection))
    backend = sa.text("SELECT pg_backend_pid()")
    try:
        with db.autocommit() as connection:
            first = connection.scalar(backend)
        for _ in range(5):
            with db.autocommit() as connection:
                assert connection.scalar(backend) == first
        assert pings == []  # a new connection, then one used within the window
        monkeypatch.setattr(database, "PING_IDLE_S", 0.0)  # from here, every connection has idled past it
        with db.autocommit() as connection:
            assert connection.scalar(backend) == first
        assert len(pings) == 1
        with psycopg.connect(database_url.replace("+psycopg", ""), autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s, 10000)", (first,))  # returns once it has gone
        with db.autocommit() as connection:  # no error reaches the caller: the pool connected again
            assert connection.scalar(backend) != first
    finally:
        db.dispose()
