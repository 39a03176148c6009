"""The text of token ids, for showing a trajectory token by token.

Each id is decoded alone by the engine's ``POST /detokenize`` (vLLM's protocol, which the reference engine
speaks too), so the same code works against vLLM, whatever its tokenizer. vLLM decodes one list per request, so
the distinct ids of a page are asked for concurrently and kept in a per-process cache (an id's text never
changes while the engine serves the same model). A token that is only part of a UTF-8 character decodes to
U+FFFD on its own; special tokens decode to their markup (``<|im_end|>``).

When no engine answers, decoding stops at once, the ids decoded so far are returned with ``error`` saying why,
and the engines are not asked again for ``retry_after_s`` (a console page then shows ids, and stays fast).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass

from polar.errors import EngineError
from polar.fleet.engines import EnginePool


@dataclass(frozen=True)
class Decoded:
    texts: dict[int, str]
    error: str | None = None  # why some ids are missing (no engine answered)


class TokenText:
    """Decodes token ids through ``engines``; safe to share between threads."""

    def __init__(
        self,
        engines: EnginePool,
        concurrency: int = 8,
        cache_size: int = 262_144,
        budget_s: float = 20.0,
        retry_after_s: float = 15.0,
    ) -> None:
        self._engines = engines
        self._concurrency = concurrency
        self._cache_size = cache_size
        self._budget_s = budget_s
        self._retry_after_s = retry_after_s
        self._cache: dict[int, str] = {}
        self._lock = threading.Lock()
        self._down: tuple[float, str] | None = None  # (monotonic time until which to skip, the error)

    def decode(self, session_id: uuid.UUID, ids: Iterable[int]) -> Decoded:
        """The text of each of ``ids`` the engine decodes, asking the session's engine (its tokenizer)."""
        wanted = set(ids)
        with self._lock:
            texts = {token: self._cache[token] for token in wanted if token in self._cache}
            down = self._down
        missing = sorted(wanted - texts.keys())
        if not missing:
            return Decoded(texts)
        if down is not None and time.monotonic() < down[0]:
            return Decoded(texts, down[1])
        error = self._ask(session_id, missing, texts)
        return Decoded(texts, error)

    def _ask(self, session_id: uuid.UUID, missing: list[int], texts: dict[int, str]) -> str | None:
        def one(token: int) -> str | None:
            reply = self._engines.post(session_id, "/detokenize", {"tokens": [token]}, None)
            body = reply.body if reply.status_code == 200 else {}  # 4xx: an id it does not know
            text = body.get("prompt", body.get("text"))  # vLLM says "prompt", SGLang "text"
            return text if isinstance(text, str) else None

        pool = ThreadPoolExecutor(max_workers=min(self._concurrency, len(missing)), thread_name_prefix="detokenize")
        try:
            futures = {pool.submit(one, token): token for token in missing}
            done, pending = wait(futures, timeout=self._budget_s, return_when=FIRST_EXCEPTION)
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
        failed: BaseException | None = None
        for future in done:
            if future.exception() is not None:
                failed = failed or future.exception()
            elif (text := future.result()) is not None:
                texts[futures[future]] = text
        self._remember({futures[f]: texts[futures[f]] for f in done if futures[f] in texts})
        if failed is not None:
            message = str(failed) if isinstance(failed, EngineError) else f"{type(failed).__name__}: {failed}"
            with self._lock:
                self._down = (time.monotonic() + self._retry_after_s, message)
            return message
        if pending:
            return f"the engine decoded {len(done)} of {len(missing)} tokens within {self._budget_s:g}s"
        with self._lock:
            self._down = None
        return None

    def _remember(self, decoded: dict[int, str]) -> None:
        with self._lock:
            for token, text in decoded.items():
                if len(self._cache) >= self._cache_size:
                    self._cache.pop(next(iter(self._cache)))  # oldest first: insertion order
                self._cache[token] = text
