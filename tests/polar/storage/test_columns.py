"""Token-id arrays reach Postgres as one text literal (``IntArrayLiteral``) and come back exactly as written."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from polar.storage.columns import int_array

_metadata = sa.MetaData()
_table = sa.Table("ids", _metadata, sa.Column("id", sa.Integer, primary_key=True), sa.Column("ids", int_array()))


@pytest.fixture
def engine(database_url: str) -> Iterator[sa.Engine]:
    engine = sa.create_engine(database_url)
    _metadata.create_all(engine)
    yield engine
    engine.dispose()


@pytest.mark.parametrize("ids", [[], [0], [151643, -1, 7, 2**31 - 1], list(range(40_000)), None])
def test_arrays_round_trip(engine: sa.Engine, ids: list[int] | None) -> None:
    with engine.begin() as connection:
        connection.execute(sa.insert(_table), {"id": 1, "ids": ids})
        assert connection.execute(sa.select(_table.c.ids)).scalar() == ids
        kind = connection.execute(sa.text("SELECT pg_typeof(ids)::text FROM ids")).scalar()
    assert kind == "integer[]"


def test_the_literal_holds_integers_only(engine: sa.Engine) -> None:
    with engine.begin() as connection, pytest.raises(sa.exc.StatementError):
        connection.execute(sa.insert(_table), {"id": 1, "ids": ["1}", "2"]})
