"""A completions request's token prompt read past the prompt it extends (``polar.chat.id_text``).

A TITO call (``polar.proxy.tito``) sends the whole conversation's ids every turn, each turn the last one's and a few
hundred more: at 40k ids, parsing and type-checking them cost the engine ~2 ms of a call here. The engine keeps the
text and ids of its last few token prompts; a request whose ``prompt`` text begins with one of them parses only the
ids after it. Anything else is parsed whole, as before.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

from polar.chat.id_text import array_span, past, read_ids, with_null
from polar.chat.json_codec import loads
from polar.refengine.protocol import CheckedPrompt

_KEY = b'"prompt":['
KEPT = 16  # prompts: a few agents' latest at once


class PromptTexts:
    """The last ``kept`` token prompts, as JSON text and as ids, shared by the engine's requests."""

    def __init__(self, kept: int = KEPT) -> None:
        self._kept: deque[tuple[bytes, CheckedPrompt]] = deque(maxlen=kept)
        self._lock = threading.Lock()

    def read(self, content: bytes) -> Any:
        """The request body ``content`` parsed, its ``prompt`` a ``CheckedPrompt`` when it is plain ids; raises
        ``ValueError`` for content that is not JSON, as ``loads`` does."""
        span = array_span(content, _KEY)
        if span is None:
            return loads(content)
        body = loads(with_null(content, span))
        if not isinstance(body, dict) or "prompt" not in body or body["prompt"] is not None:
            return loads(content)  # the key was not the request's own
        text = content[span[0] : span[1]]
        with self._lock:
            kept = sorted(self._kept, key=lambda entry: len(entry[0]), reverse=True)
        ids: CheckedPrompt | None = None
        for known, known_ids in kept:
            rest = past(text, known)
            if rest is not None:
                tail = read_ids(rest)
                ids = None if tail is None else CheckedPrompt((*known_ids, *tail))
                break
        if ids is None:
            whole = read_ids(text)
            if whole is None:
                return loads(content)  # not plain ids: the request's own check judges them
            ids = CheckedPrompt(whole)
        if ids:
            with self._lock:
                self._kept.append((text, ids))
        body["prompt"] = ids
        return body
