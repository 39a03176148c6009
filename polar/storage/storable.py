"""Writes that hold text from harness, evaluator or model output (errors, output tails, evaluation details): the
policy's to write, so it may hold what Postgres text and jsonb refuse (a NUL, a lone surrogate).

Such text is made storable where it is written (``polar.codec.json_body.storable``); as a backstop, a write the database
still refuses for a value it holds (``DataError``, or the ``UnicodeEncodeError`` a lone surrogate raises while it is
bound) is tried once more with every field made storable, so an attempt's outcome is never lost to a character.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import sqlalchemy as sa

from polar.codec.json_body import storable

log = logging.getLogger(__name__)

T = TypeVar("T")

UNSTORABLE = (sa.exc.DataError, UnicodeEncodeError)


def storable_fields(fields: Mapping[str, Any]) -> dict[str, Any]:
    """``fields`` with every text and JSON value (strings, dicts, lists) made storable; the rest (numbers, times,
    SQL expressions, ids) as they are."""
    return {name: storable(value) if isinstance(value, str | dict | list) else value for name, value in fields.items()}


def storing(write: Callable[[bool], T], what: str) -> T:
    """``write(False)``; when the database refuses a value it holds, once more as ``write(True)``: with every field
    made storable (``storable_fields``). ``write`` must be a whole unit of work (its transaction rolled back on
    the refusal)."""
    try:
        return write(False)
    except UNSTORABLE as exc:
        log.warning("%s: the database refused a value (%s); storing it made storable", what, str(exc)[:300])
        return write(True)
