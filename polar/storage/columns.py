"""Column types that are native Postgres arrays / JSONB and fall back to JSON on SQLite (embedded mode)."""

from __future__ import annotations

import struct
import sys
import uuid
from array import array
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import psycopg
import sqlalchemy as sa
from psycopg.adapt import Dumper
from psycopg.pq import Format
from sqlalchemy.dialects import postgresql


@dataclass(frozen=True)
class _Element:
    """A Postgres array element type bound in binary: its Python ``array`` typecode and the two oids."""

    typecode: str  # "i" int4, "h" int2, "f" float4: checked (and range-checked) by array() itself
    oid: int
    array_oid: int


_INT4, _INT2, _FLOAT4 = _Element("i", 23, 1007), _Element("h", 21, 1005), _Element("f", 700, 1021)
_UNSIGNED = {4: "I", 2: "H"}  # the same bytes, reinterpreted, to interleave with the length words


class _Values(array):
    """An array on its way to Postgres; ``element`` says which Postgres type."""

    element: _Element


def _array_head(oid: int, count: int) -> bytes:
    """Postgres's binary array header: one dimension of ``count`` elements of type ``oid`` (none: an empty array)."""
    return struct.pack(">iiIii", 1, 0, oid, count, 1) if count else struct.pack(">iiI", 0, 0, oid)


def _binary(values: _Values) -> bytes:
    """Postgres's binary array format: a header, then each element as (int32 length, big-endian value). Built with
    C-level array operations (~1 ms for 87k elements), where psycopg's list dumper adapts element by element (~22
    ms for 31k ids; a 75k-token trajectory's three arrays took ~100 ms) and a ``{1,2,3}`` text literal is ~10 ms
    to build and parse at 87k."""
    element, count = values.element, len(values)
    if count == 0:
        return _array_head(element.oid, 0)
    size = values.itemsize
    raw = array(_UNSIGNED[size], values.tobytes())
    if size == 4:  # (length 4, value) as pairs of 32-bit words
        body = array("I", [4]) * (2 * count)
        body[1::2] = raw
    else:  # (length 2 as two 16-bit words, value)
        body = array("H", [0, 2, 0]) * count
        body[2::3] = raw
    if sys.byteorder == "little":
        body.byteswap()
    return _array_head(element.oid, count) + body.tobytes()


def _dumper(element: _Element) -> type[Dumper]:
    class BinaryArrayDumper(Dumper):
        format = Format.BINARY
        oid = element.array_oid

        def dump(self, obj: Any) -> bytes:
            return _binary(obj)

    return BinaryArrayDumper


def _values_class(element: _Element) -> type[_Values]:
    kind = type(f"_Values_{element.typecode}", (_Values,), {"element": element})
    psycopg.adapters.register_dumper(kind, _dumper(element))
    return kind


class BinaryArray(sa.types.TypeDecorator[list[Any]]):
    """A Postgres array bound in its binary format (``_binary``): token ids, loss masks and logprobs are the
    largest parameters the proxy and postrun write (tens of thousands of elements)."""

    impl = postgresql.ARRAY(sa.Integer())
    cache_ok = True

    def __init__(self, element: _Element, sql_type: type[sa.types.TypeEngine[Any]]) -> None:
        super().__init__()
        self.element, self.sql_type = element, sql_type
        self.impl = postgresql.ARRAY(sql_type())
        self._kind = _KINDS[element.typecode]

    def bind_expression(self, bindvalue: sa.BindParameter[list[Any]]) -> sa.ColumnElement[list[Any]]:
        return sa.cast(bindvalue, postgresql.ARRAY(self.sql_type()))

    def bind_processor(self, dialect: sa.Dialect) -> Callable[[list[Any] | None], Any]:
        # Replaces (not wraps) ARRAY's own processing; array() refuses what the element type cannot hold.
        kind, typecode = self._kind, self.element.typecode

        def values(value: list[Any] | None) -> Any:
            return None if value is None else kind(typecode, value)

        return values

    def result_processor(self, dialect: sa.Dialect, coltype: object) -> None:
        # psycopg reads an array into a list already; ARRAY's own processing copied every element twice more
        # (a feed page of 1,000 trajectories: ~28 ms of its time).
        return None


class _TextArray(postgresql.ARRAY[str]):
    """``text[]``, read as psycopg gives it (a list), without ARRAY's element-by-element copy."""

    cache_ok = True

    def result_processor(self, dialect: sa.Dialect, coltype: object) -> None:
        return None


_KINDS = {element.typecode: _values_class(element) for element in (_INT4, _INT2, _FLOAT4)}


def int_array() -> sa.types.TypeEngine[list[int]]:
    """Token ids: ``integer[]`` in Postgres so users can query them in SQL."""
    return sa.JSON().with_variant(BinaryArray(_INT4, sa.Integer), "postgresql")


def real_array() -> sa.types.TypeEngine[list[float]]:
    """Logprobs: ``real[]`` in Postgres."""
    return sa.JSON().with_variant(BinaryArray(_FLOAT4, sa.REAL), "postgresql")


def small_int_array() -> sa.types.TypeEngine[list[int]]:
    """Loss masks (0/1): ``smallint[]`` in Postgres."""
    return sa.JSON().with_variant(BinaryArray(_INT2, sa.SmallInteger), "postgresql")


def text_array() -> sa.types.TypeEngine[list[str]]:
    return sa.JSON().with_variant(_TextArray(sa.Text()), "postgresql")


def is_postgres(target: Any) -> bool:
    """``target``: a ``Database``, an ORM session or a connection."""
    if hasattr(target, "is_postgres"):
        return bool(target.is_postgres)
    bind = target.get_bind() if hasattr(target, "get_bind") else target
    return bool(bind.dialect.name == "postgresql")


def array_length(db: Any, column: Any) -> Any:
    """SQL: the length of an array column (a JSON list on SQLite), 0 for a null one. ``db``: an ORM session."""
    if db.get_bind().dialect.name == "postgresql":
        return sa.func.coalesce(sa.func.cardinality(column), 0)
    return sa.func.coalesce(sa.func.json_array_length(column), 0)


_UUID_OID, _UUID_ARRAY_OID = 2950, 2951
_UUID_LENGTH = struct.pack(">i", 16)


class _Uuids(list[uuid.UUID]):
    """Ids on their way to Postgres as one ``uuid[]``."""


class _UuidArrayDumper(Dumper):
    """``uuid[]`` in its binary format: a header, then each id as (int32 length 16, its 16 bytes). psycopg's own list
    dumper writes text, checking and quoting each id with a regex: ~4 ms for a feed page's 1,000 session ids."""

    format = Format.BINARY
    oid = _UUID_ARRAY_OID

    def dump(self, obj: Any) -> bytes:
        ids = (value if isinstance(value, uuid.UUID) else uuid.UUID(str(value)) for value in obj)
        return _array_head(_UUID_OID, len(obj)) + b"".join(_UUID_LENGTH + value.bytes for value in ids)


psycopg.adapters.register_dumper(_Uuids, _UuidArrayDumper)


class _UuidArray(sa.types.TypeDecorator[list[uuid.UUID]]):
    """A parameter of ids bound as ``_Uuids`` (replacing ARRAY's element-by-element processing)."""

    impl = postgresql.ARRAY(sa.Uuid())
    cache_ok = True

    def bind_processor(self, dialect: sa.Dialect) -> Callable[[list[Any] | None], Any]:
        def values(value: list[Any] | None) -> Any:
            return None if value is None else _Uuids(value)

        return values


def any_of(db: Any, column: sa.ColumnElement[Any], values: Iterable[Any]) -> sa.ColumnElement[bool]:
    """``column IN values``; on Postgres one array parameter (``column = ANY(:values)``), so a page's thousand ids
    are one bind to render and send, not a thousand (ids in ``uuid[]``'s binary format). ``db``: a Session or
    Connection (its dialect decides)."""
    if is_postgres(db):
        kind = _UuidArray() if isinstance(column.type, sa.Uuid) else postgresql.ARRAY(column.type)
        return column == sa.any_(sa.bindparam(None, list(values), type_=kind))
    return column.in_(list(values))


def json_document() -> sa.types.TypeEngine[object]:
    """Free JSON: ``jsonb`` in Postgres. Python None is SQL NULL (not JSON ``null``), so ``IS NULL`` finds it."""
    return sa.JSON(none_as_null=True).with_variant(postgresql.JSONB(none_as_null=True), "postgresql")


def verbatim_json() -> sa.types.TypeEngine[object]:
    """Captured payloads: ``json`` (not ``jsonb``) in Postgres, which keeps key order and text exactly as sent.

    Key order matters here: a tool schema re-serialised in another order tokenises differently.
    """
    return sa.JSON().with_variant(postgresql.JSON(), "postgresql")
