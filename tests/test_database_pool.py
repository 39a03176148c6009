"""tests/database_pool.py on the real Postgres: a used database comes back empty at the template's schema (its
sequences restarted, its connections ended); one whose schema a test changed is dropped, never handed out."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
import sqlalchemy as sa

from polar.storage.migration import downgrade
from tests.conftest import ADMIN_DSN
from tests.database_pool import DatabasePool


@pytest.fixture
def pool(template_database: str) -> Iterator[DatabasePool]:
    pool = DatabasePool(ADMIN_DSN, template_database, "polar_pool_test")
    yield pool
    pool.close()


def _exists(url: str) -> bool:
    with psycopg.connect(ADMIN_DSN) as connection:
        name = url.rsplit("/", 1)[1]
        return connection.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone() is not None


def _rows(engine: sa.Engine) -> dict[str, int]:
    with engine.connect() as connection:
        tables = connection.execute(
            sa.text("SELECT tablename FROM pg_tables WHERE schemaname = 'public' AND tablename <> 'alembic_version'")
        ).scalars()
        return {t: int(connection.execute(sa.text(f"SELECT count(*) FROM {t}")).scalar_one()) for t in tables}


def test_a_used_database_comes_back_empty(pool: DatabasePool) -> None:
    url = pool.take()
    engine = sa.create_engine(url)
    with engine.begin() as connection:
        connection.execute(sa.text("INSERT INTO batches (id, defaults, request_hash, num_sessions, created_at) "
                                   "VALUES (gen_random_uuid(), '{}', 'h', 0, now())"))  # fmt: skip
        connection.execute(sa.text("INSERT INTO audit_log (at, actor, action, detail) VALUES (now(), 'a', 'b', '{}')"))
    held = engine.connect()  # a connection the test left open
    pool.give_back(url)
    again = pool.take()
    assert again == url  # reused, not copied again
    with pytest.raises(sa.exc.DBAPIError):
        held.execute(sa.text("SELECT 1"))  # ended, as a forced drop would have
    engine.dispose()
    engine = sa.create_engine(again)
    assert set(_rows(engine).values()) == {0}
    with engine.begin() as connection:
        first = connection.execute(
            sa.text("INSERT INTO audit_log (at, actor, action, detail) VALUES (now(), 'a', 'b', '{}') RETURNING id")
        ).scalar_one()
    assert first == 1  # its sequences start again
    engine.dispose()
    pool.give_back(again)


def test_a_database_whose_schema_changed_is_dropped(pool: DatabasePool) -> None:
    url = pool.take()
    downgrade(url, "0009")
    pool.give_back(url)
    assert not _exists(url)
    other = pool.take()
    assert other != url
    altered = sa.create_engine(other)
    with altered.begin() as connection:
        connection.execute(sa.text("ALTER TABLE sessions ADD COLUMN extra int"))
    altered.dispose()
    pool.give_back(other)
    assert not _exists(other)
