"""Connections to the system of record: one SQLAlchemy engine per process, sessions per unit of work."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker


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


def create_db_engine(url: str, pool_size: int = 10) -> Engine:
    """An engine for ``url``; SQLite gets WAL and a busy timeout, Postgres a pre-pinged pool."""
    if url.startswith("sqlite"):
        engine = sa.create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})
        sa.event.listen(engine, "connect", _sqlite_pragmas)
        sa.event.listen(engine, "begin", _begin_immediate)
        return engine
    return sa.create_engine(url, pool_size=pool_size, max_overflow=pool_size * 2, pool_pre_ping=True)


class Database:
    """The engine plus a session factory; ``unit()`` is one transaction that commits or rolls back."""

    def __init__(self, url: str, pool_size: int = 10) -> None:
        self.url = url
        self.engine = create_db_engine(url, pool_size=pool_size)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)

    @property
    def is_postgres(self) -> bool:
        return self.engine.dialect.name == "postgresql"

    @contextmanager
    def unit(self) -> Iterator[Session]:
        with self._sessions() as session, session.begin():
            yield session

    def dispose(self) -> None:
        self.engine.dispose()
