"""Throwaway Postgres databases (for tests and benchmarks): created on a server through an admin DSN, optionally
copied from a template, dropped afterwards."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg


def sqlalchemy_url(admin_dsn: str, database: str) -> str:
    """The SQLAlchemy URL of ``database`` on the server ``admin_dsn`` points at."""
    info = psycopg.conninfo.conninfo_to_dict(admin_dsn)
    user, host, port = info.get("user", "postgres"), info.get("host", "127.0.0.1"), info.get("port", 5432)
    return f"postgresql+psycopg://{user}@{host}:{port}/{database}"


def admin(admin_dsn: str, sql: str) -> None:
    with psycopg.connect(admin_dsn, autocommit=True) as connection:
        connection.execute(sql)  # type: ignore[arg-type]


def create_database(admin_dsn: str, prefix: str, template: str | None = None) -> str:
    """A new, uniquely named database (a copy of ``template`` if given); returns its SQLAlchemy URL."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin(admin_dsn, f"CREATE DATABASE {name}" + (f" TEMPLATE {template}" if template else ""))
    return sqlalchemy_url(admin_dsn, name)


def drop_database(admin_dsn: str, url: str) -> None:
    admin(admin_dsn, f"DROP DATABASE IF EXISTS {url.rsplit('/', 1)[1]} WITH (FORCE)")


@contextmanager
def scratch_database(admin_dsn: str, prefix: str, template: str | None = None) -> Iterator[str]:
    """A new database for the duration of the block; yields its URL."""
    url = create_database(admin_dsn, prefix, template)
    try:
        yield url
    finally:
        drop_database(admin_dsn, url)
