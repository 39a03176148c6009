"""Column types that are native Postgres arrays / JSONB and fall back to JSON on SQLite (embedded mode)."""

from __future__ import annotations

from collections.abc import Callable

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql


class IntArrayLiteral(sa.types.TypeDecorator[list[int]]):
    """``integer[]`` bound as one ``{1,2,3}`` text literal cast on the server. psycopg's list dumper adapts a list
    element by element (~22 ms for a 31k-token prompt here); joining the digits costs ~2 ms and Postgres parses
    the literal in the INSERT it was going to run anyway (~8 ms in all)."""

    impl = postgresql.ARRAY(sa.Integer())
    cache_ok = True

    def bind_expression(self, bindvalue: sa.BindParameter[list[int]]) -> sa.ColumnElement[list[int]]:
        return sa.cast(bindvalue, postgresql.ARRAY(sa.Integer()))

    def bind_processor(self, dialect: sa.Dialect) -> Callable[[list[int] | None], str | None]:
        # Replaces (not wraps) ARRAY's own processing: the value leaves as one string.
        def literal(value: list[int] | None) -> str | None:
            return None if value is None else "{" + ",".join(map(str, map(int, value))) + "}"

        return literal


def int_array() -> sa.types.TypeEngine[list[int]]:
    """Token ids: ``integer[]`` in Postgres so users can query them in SQL."""
    return sa.JSON().with_variant(IntArrayLiteral(), "postgresql")


def real_array() -> sa.types.TypeEngine[list[float]]:
    """Logprobs: ``real[]`` in Postgres."""
    return sa.JSON().with_variant(postgresql.ARRAY(sa.REAL()), "postgresql")


def small_int_array() -> sa.types.TypeEngine[list[int]]:
    """Loss masks (0/1): ``smallint[]`` in Postgres."""
    return sa.JSON().with_variant(postgresql.ARRAY(sa.SmallInteger()), "postgresql")


def text_array() -> sa.types.TypeEngine[list[str]]:
    return sa.JSON().with_variant(postgresql.ARRAY(sa.Text()), "postgresql")


def json_document() -> sa.types.TypeEngine[object]:
    """Free JSON: ``jsonb`` in Postgres. Python None is SQL NULL (not JSON ``null``), so ``IS NULL`` finds it."""
    return sa.JSON(none_as_null=True).with_variant(postgresql.JSONB(none_as_null=True), "postgresql")


def verbatim_json() -> sa.types.TypeEngine[object]:
    """Captured payloads: ``json`` (not ``jsonb``) in Postgres, which keeps key order and text exactly as sent.

    Key order matters here: a tool schema re-serialised in another order tokenises differently.
    """
    return sa.JSON().with_variant(postgresql.JSON(), "postgresql")
