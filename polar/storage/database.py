"""Connections to the system of record: one SQLAlchemy engine per process, sessions per unit of work.

Each process holds at most ``pool_size + max_overflow`` connections (``POLAR_DB_POOL_SIZE``,
``POLAR_DB_MAX_OVERFLOW``; 8 + 4 by default), named ``polar-<role>`` in ``pg_stat_activity``. A deployment needs
``processes x (pool_size + max_overflow)`` below Postgres's ``max_connections`` (100 by default): e.g. API and
proxy with 2 gunicorn workers each and four thread-pool stage workers on each of two nodes: (2 + 2 + 8) x 12 = 144,
so raise ``max_connections`` or lower the pools (threads wait for a free connection, up to 30 s). A prefork stage
worker counts once per child process.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

from polar.codec.json_body import dump_json_text
from polar.config import Config


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    # WAL lets the embedded API, proxy and worker processes read while one of them writes.
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()
    # Let SQLAlchemy's "begin" event emit BEGIN IMMEDIATE: writers then serialise at the start of a transaction
    # instead of failing on lock upgrade, which is what makes admission safe across embedded processes.
    dbapi_connection.isolation_level = None


def _begin_immediate(connection: Any) -> None:
    connection.exec_driver_sql("BEGIN IMMEDIATE")


# A pooled connection idle this long is pinged before it is handed out (a Postgres restart takes longer than
# this); one used more recently is not: the ping was a round trip on every checkout, one per model call.
PING_IDLE_S = 1.0
DEFAULT_POOL_SIZE = 8
DEFAULT_MAX_OVERFLOW = 4
DEFAULT_POOL_TIMEOUT_S = 30.0  # SQLAlchemy's own default


def create_db_engine(
    url: str,
    pool_size: int = DEFAULT_POOL_SIZE,
    max_overflow: int = DEFAULT_MAX_OVERFLOW,
    role: str = "polar",
    pool_timeout_s: float = DEFAULT_POOL_TIMEOUT_S,
) -> Engine:
    """An engine for ``url``; SQLite gets WAL and a busy timeout, Postgres a pool (pinged after idling) of at most
    ``pool_size + max_overflow`` connections, named ``polar-<role>``, where a thread waits up to
    ``pool_timeout_s`` for a free connection (then ``sqlalchemy.exc.TimeoutError``)."""
    if url.startswith("sqlite"):
        engine = sa.create_engine(
            url, connect_args={"check_same_thread": False, "timeout": 30}, json_serializer=dump_json_text
        )
        sa.event.listen(engine, "connect", _sqlite_pragmas)
        sa.event.listen(engine, "begin", _begin_immediate)
        return engine
    engine = sa.create_engine(
        url,
        pool_size=pool_size,
        max_overflow=max_overflow,
        pool_timeout=pool_timeout_s,
        # The most recently used connection first: a proxy's calls keep reusing the few connections whose
        # statements psycopg has already prepared (after 5 uses each), instead of cycling through the pool.
        pool_use_lifo=True,
        json_serializer=dump_json_text,  # captured payloads are most of what the proxy writes
        connect_args={"application_name": role if role.startswith("polar") else f"polar-{role}"},
    )
    sa.event.listen(engine, "checkout", _ping_if_idle(engine))
    sa.event.listen(engine, "connect", _mark_used)  # a new connection needs no ping
    sa.event.listen(engine, "checkin", _mark_used)
    return engine


def _ping_if_idle(engine: Engine) -> Any:
    """SQLAlchemy's ``pool_pre_ping`` for connections idle ``PING_IDLE_S`` or more: a dead one is replaced (the pool
    tries again on ``DisconnectionError``) before anyone uses it."""

    def checkout(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        if time.monotonic() - record.info.get("used_at", float("-inf")) < PING_IDLE_S:
            return
        try:
            engine.dialect.do_ping(dbapi_connection)
        except Exception as exc:  # any failure: this connection is not to be used
            raise sa.exc.DisconnectionError(f"a pooled connection failed its ping: {exc}") from exc

    return checkout


def _mark_used(_dbapi_connection: Any, record: Any) -> None:
    record.info["used_at"] = time.monotonic()


class Database:
    """The engine plus a session factory; ``unit()`` is one transaction that commits or rolls back."""

    def __init__(
        self,
        url: str,
        pool_size: int = DEFAULT_POOL_SIZE,
        max_overflow: int = DEFAULT_MAX_OVERFLOW,
        role: str = "polar",
        pool_timeout_s: float = DEFAULT_POOL_TIMEOUT_S,
    ) -> None:
        self.url = url
        self.engine = create_db_engine(url, pool_size, max_overflow, role, pool_timeout_s)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)

    @property
    def is_postgres(self) -> bool:
        return self.engine.dialect.name == "postgresql"

    @contextmanager
    def unit(self) -> Iterator[Session]:
        with self._sessions() as session, session.begin():
            yield session

    @contextmanager
    def autocommit(self) -> Iterator[sa.Connection]:
        """A connection whose every statement commits on its own: for single-statement reads and the capture insert
        on the proxy's hot path. Besides sparing a transaction, it keeps psycopg's prepared statements: a read in a
        transaction ends in the pool's ROLLBACK, and psycopg forgets every statement it prepared on a connection
        that rolls back, so the capture insert was parsed and planned afresh on every call (~1 ms). SQLite: a plain
        connection (its writers begin ``IMMEDIATE`` transactions, ``_begin_immediate``)."""
        with self.connect_autocommit() as connection:
            yield connection

    def connect_autocommit(self) -> sa.Connection:
        """``autocommit()``'s connection, checked out for the caller to close (``EarlyConnection`` holds one across a
        call's answer)."""
        connection = self.engine.connect()
        if self.is_postgres:
            connection.execution_options(isolation_level="AUTOCOMMIT")
        return connection

    @contextmanager
    def snapshot(self) -> Iterator[Session]:
        """A read-only transaction whose statements all see one snapshot (Postgres ``REPEATABLE READ``), for reads
        that must agree with each other: under the default ``READ COMMITTED`` each statement sees the commits made
        before it, so a batch row read before its last session's terminal commit and counts read after it
        disagree. SQLite's transactions are serialisable already."""
        with self._sessions() as session, session.begin():
            if self.is_postgres:
                session.connection(execution_options={"isolation_level": "REPEATABLE READ"})
                session.execute(sa.text("SET TRANSACTION READ ONLY"))
            yield session

    def dispose(self) -> None:
        self.engine.dispose()


def open_database(config: Config, role: str) -> Database:
    """This process's database, its pool sized from ``config``, named for ``role``."""
    return Database(config.database_url, config.db_pool_size, config.db_max_overflow, role)
