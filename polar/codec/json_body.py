"""JSON bodies: parsed strictly, dumped fast.

Parsing: Python's parser also takes ``NaN`` and ``Infinity``, which are not JSON (RFC 8259) and which Postgres
refuses to store, so a body holding them is a 400 here rather than a 500 later. The standard library parses on
purpose: orjson turns an integer past 64 bits into a float, silently changing what a client sent.
Dumping: orjson, with the standard library behind it for what orjson refuses."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from typing import Any

import orjson

from polar.errors import ValidationError

MAX_DEPTH = 100  # levels of objects and arrays a stored body may nest
# Where a body may hold a lone surrogate: an escape of any surrogate (a pair is legal and decodes to one
# character, so these only say whether to look), or a surrogate itself: UTF-8-encoded in bytes (the parser
# decodes bytes with ``surrogatepass``), a character in text. Separate patterns: an alternation of the two scans
# a 400 KiB body ~10x slower than both alone.
_ESCAPED_BYTES, _ESCAPED_TEXT = re.compile(rb"\\u[dD][89a-fA-F]"), re.compile(r"\\u[dD][89a-fA-F]")
_RAW_BYTES, _RAW_TEXT = re.compile(rb"\xed[\xa0-\xbf]"), re.compile(r"[\ud800-\udfff]")


def _refuse(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def parse_json(raw: bytes | str) -> Any:
    """The decoded body; ``ValidationError`` saying why when it is not JSON, or when a string in it holds a lone
    UTF-16 surrogate (``"\\ud83d"`` with no low half: Node CLIs cut strings mid-emoji). Python's parser accepts one,
    but it cannot be encoded as UTF-8 again, so the engine request built from it, or its capture, would fail
    later with a 500 instead of this 400."""
    try:
        value = json.loads(raw, parse_constant=_refuse)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValidationError(f"request body is not valid JSON: {exc}") from exc
    except RecursionError:
        raise ValidationError("request body is nested too deeply") from None
    if _may_hold_surrogates(raw):  # most bodies hold no surrogate escape at all, and are not walked
        for item, path, _ in _walk(value):
            where = path or "request body"
            if isinstance(item, str):
                _check_surrogates(item, where, path or None)
            elif isinstance(item, dict):
                for key in item:
                    _check_surrogates(key, f"{where}: key {key!r}", path or None)
    return value


def _may_hold_surrogates(raw: bytes | str) -> bool:
    if isinstance(raw, str):
        return _ESCAPED_TEXT.search(raw) is not None or _RAW_TEXT.search(raw) is not None
    return _ESCAPED_BYTES.search(raw) is not None or (b"\xed" in raw and _RAW_BYTES.search(raw) is not None)


def check_storable(value: Any) -> None:
    """Refuse what JSON can carry but Postgres cannot store, naming where it is (``tasks[0].instruction``): a NUL
    character or a lone surrogate in a string or key (text and jsonb hold neither), or a number too large for a
    float (``1e999`` decodes to infinity). Checked before anything is written, so the caller gets a 400, not a
    500 from the database. Nesting is bounded too (``MAX_DEPTH``): what the parser accepts at the bottom of a request's
    stack, encoding it again for the database deeper down could not."""
    for item, path, depth in _walk(value):
        where = path or "request body"
        if depth > MAX_DEPTH:
            raise ValidationError(f"{where}: nested deeper than {MAX_DEPTH} levels", field=path or None)
        if isinstance(item, str):
            _check_text(item, where, path or None)
        elif isinstance(item, float) and not math.isfinite(item):
            raise ValidationError(f"{where}: number out of range", field=path or None)
        elif isinstance(item, dict):
            for key in item:
                _check_text(key, f"{where}: key {key!r}", path or None)


# What takes the place of a character Postgres cannot store (a NUL, a lone surrogate) in text Polar keeps.
REPLACEMENT = "\ufffd"
_UNSTORABLE = re.compile(r"[\x00\ud800-\udfff]")


def storable_text(text: str) -> str:
    """``text`` with what Postgres text and jsonb cannot hold (NUL, lone UTF-16 surrogates) replaced by U+FFFD. For
    text Polar keeps from harness, evaluator or model output (errors, output tails, evaluation details): that text is
    the policy's to write, and a byte the database refuses must not turn its outcome into a crash."""
    return _UNSTORABLE.sub(REPLACEMENT, text) if _UNSTORABLE.search(text) else text


def storable(value: Any) -> Any:
    """``value`` (JSON-shaped: dicts, lists, strings, numbers) as Postgres can store it in text or jsonb: strings and
    keys through ``storable_text``, numbers that are no finite float (``1e999``) as null, anything nested deeper than
    ``MAX_DEPTH`` as its (cleaned) text. The value itself is never changed; a copy is returned where needed."""
    return _storable(value, 0)


def _storable(value: Any, depth: int) -> Any:
    if isinstance(value, str):
        return storable_text(value)
    if isinstance(value, bool) or value is None or isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if depth >= MAX_DEPTH and isinstance(value, dict | list | tuple):
        return storable_text(repr(value)[:2000])
    if isinstance(value, dict):
        return {storable_text(str(key)): _storable(item, depth + 1) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_storable(item, depth + 1) for item in value]
    return storable_text(str(value))


def _walk(value: Any) -> Iterator[tuple[Any, str, int]]:
    """Every value in ``value`` with its path (``tasks[0].instruction``) and depth, without recursion."""
    pending: list[tuple[Any, str, int]] = [(value, "", 0)]
    while pending:
        item, path, depth = pending.pop()
        yield item, path, depth
        if isinstance(item, dict):
            pending.extend((child, f"{path}.{key}" if path else key, depth + 1) for key, child in item.items())
        elif isinstance(item, list):
            pending.extend((child, f"{path}[{index}]", depth + 1) for index, child in enumerate(item))


def _check_text(text: str, where: str, field: str | None) -> None:
    if "\x00" in text:
        raise ValidationError(f"{where}: must not contain a NUL character (\\u0000)", field=field)
    _check_surrogates(text, where, field)


def _check_surrogates(text: str, where: str, field: str | None) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValidationError(f"{where}: must not contain a lone UTF-16 surrogate", field=field) from None


def dump_json(value: Any) -> bytes:
    """``value`` as compact JSON bytes, key order kept: orjson (5x the standard library on large bodies), or the
    standard library for what orjson refuses (integers past 64 bits, which JSON allows)."""
    try:
        return orjson.dumps(value)
    except TypeError:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


def dump_json_text(value: Any) -> str:
    """``dump_json`` as text: what SQLAlchemy binds into a ``json`` column."""
    return dump_json(value).decode()
