"""Column types that are native Postgres arrays / JSONB and fall back to JSON on SQLite (embedded mode)."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql


def int_array() -> sa.types.TypeEngine[list[int]]:
    """Token ids: ``integer[]`` in Postgres so users can query them in SQL."""
    return sa.JSON().with_variant(postgresql.ARRAY(sa.Integer()), "postgresql")


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
