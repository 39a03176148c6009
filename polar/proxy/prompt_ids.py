"""Reading an engine's answer without re-reading the prompt ids it repeats.

Every captured chat completion carries the whole prompt as ``prompt_token_ids`` (protocols.md §1.2): at agent size,
tens of thousands of ids. Parsing them (~1.2 ms at 40k ids here), checking each is a plain int (~0.8 ms) and
packing them for the chain hash (~0.5 ms) was the largest share of the proxy's own time on such a call. An agent's
next prompt is nearly always its previous prompt plus the answer and a tool result, so the engine's text for it
begins with the text it sent last time.

``KnownPrompts`` keeps, per (session, agent), the last prompt's ids as the engine wrote them and as checked
``TokenIds`` (with their int32 bytes). The next answer's ids are compared as bytes (a memcmp), and only the ids past
the repeated text are parsed and packed. Ids read here are checked by their text: digits and commas only, which
JSON can only read as non-negative ints, so ``token_check`` trusts them without a pass over their types.

Anything unexpected (the key found twice or not at top level, other characters, a prompt that does not extend the
last one) is read the ordinary way: the cache saves work and decides nothing.
"""

from __future__ import annotations

import struct
import threading
import uuid
from collections import OrderedDict
from typing import Any

import orjson

from polar.storage.prompts import TokenIds

_KEY = b'"prompt_token_ids":['
_ID_TEXT = b"0123456789,"
KEPT_BYTES = 32 * 1024 * 1024  # the ids' text a process keeps (their ids cost ~6x that in memory)
KEPT_PROMPTS = 1024

Known = tuple[bytes, TokenIds]


def _ids(text: bytes, known: TokenIds | None = None) -> TokenIds | None:
    """``text`` (``1,2,3``) as ids after ``known``'s; None unless it is digits and single commas only."""
    if not text:
        return TokenIds(known or [], (known.int32 if known is not None else b""))
    if text.translate(None, _ID_TEXT) or text[0] == 44 or text[-1] == 44 or b",," in text:  # 44: ","
        return None
    try:
        tail = orjson.loads(b"[" + text + b"]")  # a leading zero ("01") is refused here
        packed = struct.pack(f"<{len(tail)}i", *tail)  # past int32: refused here
    except (ValueError, struct.error):
        return None
    if known is None:
        return TokenIds(tail, packed)
    return TokenIds(known + tail, known.int32 + packed)


def _places(body: Any) -> list[dict[str, Any]]:
    """Where an answer carries its prompt's ids: a chat completion at its top level, a completion (TITO) in its
    first choice."""
    if not isinstance(body, dict):
        return []
    choices = body.get("choices")
    first = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else None
    return [body] if first is None else [body, first]


class KnownPrompts:
    """The last prompt each (session, agent) was answered with in this process, bounded (least recently used
    out). Thread-safe."""

    def __init__(self, kept_bytes: int = KEPT_BYTES, kept_prompts: int = KEPT_PROMPTS) -> None:
        self._kept_bytes, self._kept_prompts = kept_bytes, kept_prompts
        self._known: OrderedDict[tuple[uuid.UUID, str | None], Known] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def parse(self, session_id: uuid.UUID, agent: str | None, content: bytes) -> Any:
        """The engine's answer ``content`` parsed, its ``prompt_token_ids`` as ``TokenIds``, read only
        past the text the last prompt of (``session_id``, ``agent``) shares with it. Raises ``ValueError`` for
        content that is not JSON, as ``orjson.loads`` does."""
        start = content.find(_KEY)
        if start < 0 or content.find(_KEY, start + 1) >= 0:
            return orjson.loads(content)
        begin = start + len(_KEY)
        end = content.find(b"]", begin)
        if end < 0:
            return orjson.loads(content)
        body = orjson.loads(b"%snull%s" % (content[: begin - 1], content[end + 1 :]))
        holders = [
            place for place in _places(body) if "prompt_token_ids" in place and place["prompt_token_ids"] is None
        ]
        if len(holders) != 1:
            return orjson.loads(content)  # the key was not the answer's own, or not where it seemed
        text = content[begin:end]
        key = (session_id, agent)
        with self._lock:
            known = self._known.get(key)
        ids = None
        if known is not None and text.startswith(known[0]):
            rest = text[len(known[0]) :]
            if not rest or (rest[0] == 44 and known[0]):  # the last prompt's ids, then more ids
                ids = _ids(rest[1:], known[1])
        if ids is None:
            ids = _ids(text)
        if ids is None:
            return orjson.loads(content)  # not plain ids: read as sent, and token_check judges them
        holders[0]["prompt_token_ids"] = ids
        self._keep(key, text, ids)
        return body

    def _keep(self, key: tuple[uuid.UUID, str | None], text: bytes, ids: TokenIds) -> None:
        with self._lock:
            old = self._known.pop(key, None)
            if old is not None:
                self._bytes -= len(old[0])
            if len(text) > self._kept_bytes:
                return
            self._known[key] = (text, ids)
            self._bytes += len(text)
            while self._bytes > self._kept_bytes or len(self._known) > self._kept_prompts:
                self._bytes -= len(self._known.popitem(last=False)[1][0])
