"""Core statements run on psycopg's cursor give what SQLAlchemy's execution gives: the same rows and values, its
exception classes, and a dropped connection invalidated so the pool replaces it."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa

from polar.storage.database import Database
from polar.storage.driver_statements import DriverStatement
from polar.storage.outage import unreachable

_metadata = sa.MetaData()
_things = sa.Table(
    "driver_statement_things",
    _metadata,
    sa.Column("id", sa.Uuid(), primary_key=True),
    sa.Column("n", sa.Integer(), nullable=False),
    sa.Column("doc", sa.JSON()),
    sa.Column("tag", sa.Text()),
)
_INSERT = (
    _things.insert()
    .values(id=sa.bindparam("id"), n=sa.bindparam("n"), doc=sa.bindparam("doc"), tag="fixed")
    .returning(_things.c.n)
)
# A literal bind (``n > 0``), a JSON column and a union, as the capture's statements have.
_READ = sa.union_all(
    sa.select(sa.true().label("big"), _things.c.id, _things.c.doc).where(
        _things.c.n > 0, _things.c.n >= sa.bindparam("least")
    ),
    sa.select(sa.false(), _things.c.id, _things.c.doc).where(_things.c.n < sa.bindparam("least")),
)


def _filled(db: Database) -> list[uuid.UUID]:
    _metadata.create_all(db.engine)
    ids = [uuid.uuid4() for _ in range(3)]
    insert = DriverStatement(_INSERT)
    with db.engine.begin() as connection:
        for n, id_ in enumerate(ids):
            assert insert.scalar(connection, {"id": id_, "n": n, "doc": {"n": n, "list": [n, "x"]}}) == n
    return ids


@pytest.mark.parametrize("backend", ["postgres", "sqlite"])
def test_the_same_rows_as_sqlalchemy(backend: str, database_url: str, tmp_path: Path) -> None:
    db = Database(database_url if backend == "postgres" else f"sqlite:///{tmp_path / 'polar.db'}")
    try:
        ids = _filled(db)
        with db.autocommit() as connection:
            ours = DriverStatement(_READ).rows(connection, {"least": 1})
            theirs = connection.execute(_READ, {"least": 1}).all()
            stored_tags = connection.execute(sa.select(_things.c.tag)).scalars().all()
        assert sorted(tuple(row) for row in ours) == sorted(tuple(row) for row in theirs)
        assert {row.id: (row.big, row.doc) for row in ours} == {
            ids[0]: (False, {"n": 0, "list": [0, "x"]}),
            ids[1]: (True, {"n": 1, "list": [1, "x"]}),
            ids[2]: (True, {"n": 2, "list": [2, "x"]}),
        }
        assert stored_tags == ["fixed"] * 3
    finally:
        db.dispose()


def test_errors_are_sqlalchemys_and_leave_the_connection_usable(database_url: str) -> None:
    db = Database(database_url)
    try:
        ids = _filled(db)
        with db.autocommit() as connection:
            with pytest.raises(sa.exc.IntegrityError) as caught:
                DriverStatement(_INSERT).scalar(connection, {"id": ids[0], "n": 9, "doc": None})
            assert not unreachable(caught.value) and not caught.value.connection_invalidated
            assert len(DriverStatement(_READ).rows(connection, {"least": 1})) == 3
    finally:
        db.dispose()


def test_a_dropped_connection_is_invalidated_and_replaced(database_url: str) -> None:
    db = Database(database_url)
    try:
        _filled(db)
        with db.autocommit() as connection:
            pid = connection.scalar(sa.text("SELECT pg_backend_pid()"))
            with db.autocommit() as other:
                other.execute(sa.text("SELECT pg_terminate_backend(:pid, 10000)"), {"pid": pid})
            with pytest.raises(sa.exc.OperationalError) as caught:
                DriverStatement(_READ).rows(connection, {"least": 0})
            assert unreachable(caught.value) and caught.value.connection_invalidated
        with db.autocommit() as connection:  # the pool made a new one; the outage is over for the next call
            assert connection.scalar(sa.text("SELECT pg_backend_pid()")) != pid
            assert len(DriverStatement(_READ).rows(connection, {"least": 1})) == 3
    finally:
        db.dispose()
