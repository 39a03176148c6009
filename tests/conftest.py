"""Shared fixtures. Tests run against the machine's real PostgreSQL and Redis (see scripts/ensure-services.sh):
each test that needs a database gets a fresh one, copied from a template migrated once to head."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest
import redis

from polar.storage.migration import upgrade

ADMIN_DSN = os.environ.get("POLAR_TEST_ADMIN_DSN", "postgresql://postgres@127.0.0.1:5432/test")
REDIS_BASE = os.environ.get("POLAR_TEST_REDIS", "redis://127.0.0.1:6379")
TEMPLATE = f"polar_template_{os.getpid()}"


def _sqlalchemy_url(database: str) -> str:
    info = psycopg.conninfo.conninfo_to_dict(ADMIN_DSN)
    user, host, port = info.get("user", "postgres"), info.get("host", "127.0.0.1"), info.get("port", 5432)
    return f"postgresql+psycopg://{user}@{host}:{port}/{database}"


def _admin(sql: str) -> None:
    with psycopg.connect(ADMIN_DSN, autocommit=True) as connection:
        connection.execute(sql)  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def template_database() -> Iterator[str]:
    _admin(f"DROP DATABASE IF EXISTS {TEMPLATE}")
    _admin(f"CREATE DATABASE {TEMPLATE}")
    upgrade(_sqlalchemy_url(TEMPLATE))
    yield TEMPLATE
    _admin(f"DROP DATABASE IF EXISTS {TEMPLATE} WITH (FORCE)")


@contextmanager
def _fresh_database(prefix: str, template: str | None = None) -> Iterator[str]:
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    _admin(f"CREATE DATABASE {name}" + (f" TEMPLATE {template}" if template else ""))
    try:
        yield _sqlalchemy_url(name)
    finally:
        _admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture
def database_url(template_database: str) -> Iterator[str]:
    """A fresh, migrated Postgres database for this test."""
    with _fresh_database("polar_test", template_database) as url:
        yield url


@pytest.fixture
def empty_database_url() -> Iterator[str]:
    """A fresh database with no schema at all (for migration tests)."""
    with _fresh_database("polar_empty") as url:
        yield url


@pytest.fixture
def broker_url() -> Iterator[str]:
    """A Redis database of its own (emptied before and after), as the Celery broker."""
    url = f"{REDIS_BASE}/9"
    client = redis.Redis.from_url(url)
    client.flushdb()
    yield url
    client.flushdb()
    client.close()


@pytest.fixture(scope="module")
def module_database_url(template_database: str) -> Iterator[str]:
    """A fresh, migrated database shared by one test module (for expensive module-scoped stacks)."""
    with _fresh_database("polar_module", template_database) as url:
        yield url
