"""Reading an engine's answer without re-reading the prompt ids it repeats.

Every captured chat completion carries the whole prompt as ``prompt_token_ids`` (protocols.md §1.2): at agent size,
tens of thousands of ids. Parsing them (~1.2 ms at 40k ids here), checking each is a plain int (~0.8 ms) and
packing them for the chain hash (~0.5 ms) was the largest share of the proxy's own time on such a call. An agent's
next prompt is nearly always its previous prompt plus the answer and a tool result, so the engine's text for it
begins with the text it sent last time.

``KnownPrompts`` keeps, per (session, agent), the last prompt's ids as the engine wrote them and as checked
``TokenIds`` (with their int32 bytes). The next answer's ids are compared as bytes, and only the ids past the
repeated text are parsed and packed (``polar.chat.id_text``). Ids read so are digits and commas only, which JSON
can only read as non-negative ints, so ``token_check`` trusts them without a pass over their types.

Anything unexpected (the key found twice, or not where an answer keeps it, other characters, a prompt that does not
extend the last one) is read the ordinary way: the cache saves work and decides nothing.
"""

from __future__ import annotations

import struct
import sys
import threading
import uuid
from collections import OrderedDict
from typing import Any

import orjson

from polar.chat.id_text import array_span, past, read_ids, with_null
from polar.storage.prompts import TokenIds

_KEY = b'"prompt_token_ids":['
KEPT_BYTES = 16 * 1024 * 1024  # the ids' text a process keeps: with their ids, ~7.4x that in memory (~120 MB)
KEPT_PROMPTS = 1024

Known = tuple[bytes, TokenIds]


def _packed(ids: list[int]) -> bytes | None:
    """``ids`` as little-endian int32; None past that range."""
    try:
        return struct.pack(f"<{len(ids)}i", *ids)
    except struct.error:
        return None


def _ids(text: bytes) -> TokenIds | None:
    """``text`` as ids, packed as int32 as they are read; None unless plain int32 ids."""
    ids = read_ids(text)
    packed = None if ids is None else _packed(ids)
    return None if ids is None or packed is None else TokenIds(ids, packed)


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
        """The engine's answer ``content`` parsed, its ``prompt_token_ids`` as ``TokenIds``, read only past the text
        the last prompt of (``session_id``, ``agent``) shares with it. Raises ``ValueError`` for content that is not
        JSON, as ``orjson.loads`` does."""
        span = array_span(content, _KEY)
        if span is None:
            return orjson.loads(content)
        body = orjson.loads(with_null(content, span))
        holders = [
            place for place in _places(body) if "prompt_token_ids" in place and place["prompt_token_ids"] is None
        ]
        if len(holders) != 1:
            return orjson.loads(content)  # the key was not the answer's own, or not where it seemed
        text = content[span[0] : span[1]]
        key = (session_id, agent)
        ids = self._grown(key, text)
        if ids is None:
            ids = _ids(text)
        if ids is None:
            return orjson.loads(content)  # not plain ids: read as sent, and token_check judges them
        holders[0]["prompt_token_ids"] = ids
        self._keep(key, text, ids)
        return body

    def _grown(self, key: tuple[uuid.UUID, str | None], text: bytes) -> TokenIds | None:
        """``text``'s ids as ``key``'s last prompt and the ids after it; None unless it extends that prompt.

        The last prompt is taken out while it is read, and grown in place when nothing else holds it any more (the
        answer it came in has been recorded and let go): a copy, and freeing the old list, would each touch all its
        ids, memory an agent's turn has mostly pushed out of the caches (the proxy's own time at 40k ids: 0.3-0.7 ms
        less here). A concurrent call of the same agent finds nothing meanwhile and reads its ids whole."""
        with self._lock:
            taken = self._known.pop(key, None)
            if taken is not None:
                self._bytes -= len(taken[0])
        if taken is None:
            return None
        known_text, known = taken
        del taken  # the cache's tuple: only ``known`` refers to the list from here, unless an answer still does
        rest = past(text, known_text)
        tail = None if rest is None else read_ids(rest)
        packed = None if tail is None else _packed(tail)
        if tail is None or packed is None:
            return None
        # This name and getrefcount's argument only: no one else can see it change.
        grown = known if sys.getrefcount(known) == 2 else TokenIds(known, known.int32, known.digest)
        grown.extend(tail)
        grown.int32 += packed
        return grown

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
