"""Reading request pieces the same way in every view: the services, JSON bodies, ids, paging."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from flask import current_app, request

from polar.codec.json_body import check_storable, parse_json
from polar.errors import NotFound, ValidationError
from polar.services import Services


def services() -> Services:
    return current_app.extensions["polar"]  # type: ignore[no-any-return]


def json_body() -> Any:
    """The request's JSON body, refused with a 400 unless it is JSON the database can store."""
    if not request.is_json:
        raise ValidationError("request body must be JSON (Content-Type: application/json)")
    body = parse_json(request.get_data(cache=True))
    check_storable(body)
    return body


def parse_id(value: str, kind: str) -> uuid.UUID:
    """The id in ``value``, written as a UUID is (hyphenated hex, either case): Python also reads ``{...}``,
    ``urn:uuid:`` and bare hex, which no id the API hands out looks like."""
    try:
        parsed = uuid.UUID(value)
    except ValueError:
        parsed = None
    if parsed is None or str(parsed) != value.lower():
        raise NotFound(f"{kind} {value!r} not found (ids are UUIDs)")
    return parsed


def query_arg(name: str, default: str | None = None) -> str | None:
    """The query parameter ``name`` (``default`` when absent); a 400 when it is given more than once, since which
    value was meant is anybody's guess."""
    values = request.args.getlist(name)
    if len(values) > 1:
        raise ValidationError(f"{name}: give it once, not {len(values)} times", field=name)
    return values[0] if values else default


def int_arg(name: str, default: int, low: int, high: int) -> int:
    raw = query_arg(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValidationError(f"{name}: must be an integer, got {raw!r}", field=name) from None
    if not low <= value <= high:
        raise ValidationError(f"{name}: must be between {low} and {high}, got {value}", field=name)
    return value


@dataclass(frozen=True)
class IntArg:
    """An integer query parameter: what a view reads (:meth:`read`) and what ``/openapi.json`` says of it
    (:meth:`schema`), from the same numbers."""

    name: str
    default: int
    low: int
    high: int

    def read(self) -> int:
        return int_arg(self.name, self.default, self.low, self.high)

    def schema(self) -> dict[str, Any]:
        return {"type": "integer", "minimum": self.low, "maximum": self.high, "default": self.default}
