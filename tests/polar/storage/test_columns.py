"""Token ids, loss masks and logprobs reach Postgres in the binary array format (``BinaryArray``) and come back
exactly as written."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from polar.storage.columns import any_of, int_array, real_array, small_int_array

_metadata = sa.MetaData()
_table = sa.Table(
    "ids",
    _metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("ids", int_array()),
    sa.Column("mask", small_int_array()),
    sa.Column("logprobs", real_array()),
)
_uuids = sa.Table("uuids", _metadata, sa.Column("id", sa.Uuid, primary_key=True))


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


def test_only_32_bit_integers_are_token_ids(engine: sa.Engine) -> None:
    with engine.begin() as connection, pytest.raises(sa.exc.StatementError):
        connection.execute(sa.insert(_table), {"id": 1, "ids": ["1}", "2"]})
    with engine.begin() as connection, pytest.raises(sa.exc.StatementError):
        connection.execute(sa.insert(_table), {"id": 1, "ids": [2**31]})


@pytest.mark.parametrize("size", [0, 1, 3, 75_000])
def test_masks_and_logprobs_round_trip(engine: sa.Engine, size: int) -> None:
    mask = [i % 2 for i in range(size)]
    logprobs = [-0.5 - i / 8 for i in range(size)]  # exact in float32
    if size:
        logprobs[0] = float("-inf")
    with engine.begin() as connection:
        connection.execute(sa.insert(_table), {"id": 1, "mask": mask, "logprobs": logprobs})
        assert tuple(connection.execute(sa.select(_table.c.mask, _table.c.logprobs)).one()) == (mask, logprobs)
        kinds = connection.execute(sa.text("SELECT pg_typeof(mask)::text, pg_typeof(logprobs)::text FROM ids")).one()
    assert tuple(kinds) == ("smallint[]", "real[]")


@pytest.mark.parametrize("wanted", [0, 1, 3, 1_000])
def test_ids_are_matched_as_one_uuid_array(engine: sa.Engine, wanted: int) -> None:
    ids = [uuid.uuid4() for _ in range(1_010)]
    with engine.begin() as connection:
        connection.execute(sa.insert(_uuids), [{"id": value} for value in ids])
        chosen = [*ids[:wanted], uuid.uuid4()]  # one that is not there
        found = connection.execute(sa.select(_uuids.c.id).where(any_of(connection, _uuids.c.id, chosen))).scalars()
        assert sorted(found) == sorted(ids[:wanted])
        as_text = [str(value) for value in ids[:3]]  # ids given as text are the same ids
        found = connection.execute(sa.select(_uuids.c.id).where(any_of(connection, _uuids.c.id, as_text))).scalars()
        assert sorted(found) == sorted(ids[:3])
