"""Token ids as JSON text (``1,2,3``): found in a body, compared as bytes, and parsed only where new.

A token prompt of tens of thousands of ids costs ~1.2 ms to parse and ~0.8 ms to type-check here, and an agent's
next prompt nearly always repeats its last one and adds a few hundred ids. Both sides of the proxy's engine hop read
such prompts (the proxy the engine's ``prompt_token_ids``, the reference engine a TITO request's ``prompt``), and
both keep the last text they read, so the next one is compared with it (a memcmp) and parsed past it.

Text of digits and single commas can only be read by JSON as non-negative ints, so ids read from it need no check
of their types; anything else is left to the ordinary parse, and to the caller's own checks.
"""

from __future__ import annotations

from polar.chat.json_codec import loads

_ID_CHARACTERS = b"0123456789,"
_COMMA = 44


def array_span(content: bytes, key: bytes) -> tuple[int, int] | None:
    """Where the one array of ids named ``key`` (``b'"prompt":['``) lies in ``content``: (first byte of its text,
    its closing bracket); None when the key is missing, or there more than once."""
    start = content.find(key)
    if start < 0 or content.find(key, start + 1) >= 0:
        return None
    begin = start + len(key)
    end = content.find(b"]", begin)
    return None if end < 0 else (begin, end)


def with_null(content: bytes, span: tuple[int, int]) -> bytes:
    """``content`` with the array at ``span`` written as ``null``: the rest of the body, cheap to parse."""
    return b"%snull%s" % (content[: span[0] - 1], content[span[1] + 1 :])


def read_ids(text: bytes) -> list[int] | None:
    """The ids in ``text``, or None unless it is digits and single commas only (a leading zero, ``01``, is refused
    by the parse)."""
    if not text:
        return []
    if text.translate(None, _ID_CHARACTERS) or text[0] == _COMMA or text[-1] == _COMMA or b",," in text:
        return None
    try:
        ids: list[int] = loads(b"[" + text + b"]")
    except ValueError:
        return None
    return ids


def past(text: bytes, known: bytes) -> bytes | None:
    """The text of the ids ``text`` has after ``known``'s (b"" when the same), or None unless ``text`` is ``known``'s
    ids followed by more (``12,345,67`` does not continue ``12,345,6``)."""
    if not known or not text.startswith(known):
        return None
    rest = text[len(known) :]
    if rest and (rest[0] != _COMMA or len(rest) == 1):  # "…,6" + "7…", or a trailing comma
        return None
    return rest[1:]
