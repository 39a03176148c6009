"""The latest TITO chain tips of each (session, agent), so a TITO call finds the call it continues without reading
its session back (audit F18: the lookup read and rebuilt every earlier call, O(n) a call, O(n²) a session).

A tip is what ``polar.proxy.tito.find_link`` needs of an answered call: its answer's identities, a key of the
messages it was sent (``break_reasons.history_key``: equal keys mean ``same_history``), its tools' names, and its
exact prompt + completion ids. The proxy remembers one after every successful call of a TITO session; the next call
looks among the agent's last ``TIPS_PER_AGENT`` and only falls back to reading the session when none fits.

    tips = tip_store(config.redis_url)
    tips.remember(session_id, agent, tip, keep_s)      # after the call is captured
    for tip in tips.recent(session_id, agent): ...     # newest first

The proxy runs as several gunicorn workers (maybe on several machines), and consecutive calls of a session land on
any of them, so with Redis the tips are shared (``RedisTips``: a short list per (session, agent), expiring with the
session's call counts). Without Redis (embedded mode) they are this process's own (``LocalTips``). Both are bounded:
the local store by ``LOCAL_MAX_TOKENS`` (least recently used (session, agent) first), Redis's by the expiry and the
list's length. A tip that is missing (evicted, expired, Redis away) costs only the slow path, never a wrong link.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sys
import threading
import uuid
from array import array
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import redis
from redis.exceptions import RedisError

from polar.storage.prompts import TokenIds

log = logging.getLogger(__name__)

TIPS_PER_AGENT = 2  # the latest answer, and the one before it (a retried turn, an interleaved sub-agent)
LOCAL_MAX_TOKENS = 8_000_000  # ids held by one process's store: 32 MB as int32
REDIS_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class Tip:
    """An answered call a later call may continue."""

    call_id: uuid.UUID
    identities: frozenset[str]  # digests of its answer's identities (``identity_digests``)
    history: str  # ``history_key`` of the messages it was sent
    tools: tuple[str, ...]  # the names of the tools it was offered
    tokens: array  # its full prompt, then its completion (int32)
    prompt_len: int
    finish_reason: str | None

    @property
    def prompt_ids(self) -> list[int]:
        return self.tokens[: self.prompt_len].tolist()

    @property
    def completion_ids(self) -> list[int]:
        return self.tokens[self.prompt_len :].tolist()

    def encode(self) -> bytes:
        header = {
            "call_id": str(self.call_id),
            "identities": sorted(self.identities),
            "history": self.history,
            "tools": list(self.tools),
            "prompt_len": self.prompt_len,
            "finish_reason": self.finish_reason,
        }
        return json.dumps(header).encode() + b"\n" + self.tokens.tobytes()

    @classmethod
    def decode(cls, data: bytes) -> Tip:
        header_bytes, _, token_bytes = data.partition(b"\n")
        header = json.loads(header_bytes)
        tokens = array("i")
        tokens.frombytes(token_bytes)
        return cls(uuid.UUID(header["call_id"]), frozenset(header["identities"]), header["history"],
                   tuple(header["tools"]), tokens, int(header["prompt_len"]), header["finish_reason"])  # fmt: skip


def identity_digests(identities: Iterable[tuple[Any, ...]]) -> frozenset[str]:
    """``tito._identities`` as short digests (what a tip keeps and compares)."""
    return frozenset(
        hashlib.blake2b(json.dumps(i, default=repr, ensure_ascii=False).encode(), digest_size=16).hexdigest()
        for i in identities
    )


def tip(
    call_id: uuid.UUID,
    identities: Iterable[tuple[Any, ...]],
    history: str,
    tools: Sequence[str],
    prompt: Sequence[int],
    completion: Sequence[int],
    finish_reason: str | None,
) -> Tip:
    tokens = array("i")
    if type(prompt) is TokenIds and sys.byteorder == "little":  # its int32 bytes are this machine's array's
        tokens.frombytes(prompt.int32)
    else:
        tokens.extend(prompt)
    tokens.extend(completion)
    return Tip(call_id, identity_digests(identities), history, tuple(tools), tokens, len(prompt), finish_reason)


class TipStore(Protocol):
    def recent(self, session_id: uuid.UUID, agent: str | None) -> list[Tip]:
        """The agent's latest tips in the session, newest first (empty when none is known)."""
        ...

    def remember(self, session_id: uuid.UUID, agent: str | None, tip: Tip, keep_s: int) -> None:
        """Keep ``tip`` as the agent's newest (for ``keep_s`` at least, where the store expires entries)."""
        ...


class LocalTips:
    """This process's tips, least recently used (session, agent) evicted past ``max_tokens``."""

    def __init__(self, max_tokens: int = LOCAL_MAX_TOKENS) -> None:
        self.max_tokens = max_tokens
        self._tips: OrderedDict[tuple[uuid.UUID, str | None], list[Tip]] = OrderedDict()
        self._tokens = 0
        self._lock = threading.Lock()

    def recent(self, session_id: uuid.UUID, agent: str | None) -> list[Tip]:
        with self._lock:
            found = self._tips.get((session_id, agent))
            if found is None:
                return []
            self._tips.move_to_end((session_id, agent))
            return list(found)

    def remember(self, session_id: uuid.UUID, agent: str | None, tip: Tip, keep_s: int) -> None:
        with self._lock:
            kept = [tip, *self._tips.pop((session_id, agent), [])]
            self._tokens -= sum(len(t.tokens) for t in kept[1:])
            kept = kept[:TIPS_PER_AGENT]
            self._tips[(session_id, agent)] = kept
            self._tokens += sum(len(t.tokens) for t in kept)
            while self._tokens > self.max_tokens and len(self._tips) > 1:
                _, evicted = self._tips.popitem(last=False)
                self._tokens -= sum(len(t.tokens) for t in evicted)

    def __len__(self) -> int:
        return len(self._tips)


class RedisTips:
    """Tips shared by every proxy process: a list per (session, agent), newest first, expiring ``keep_s`` after its
    last call. While Redis is unreachable nothing is remembered and nothing found (the slow path answers)."""

    def __init__(self, redis_url: str) -> None:
        self._redis = redis.Redis.from_url(
            redis_url, socket_timeout=REDIS_TIMEOUT_S, socket_connect_timeout=REDIS_TIMEOUT_S
        )

    @staticmethod
    def _key(session_id: uuid.UUID, agent: str | None) -> str:
        named = hashlib.blake2b((agent or "").encode(), digest_size=8).hexdigest() if agent is not None else "-"
        return f"polar:tito:tips:{session_id}:{named}"

    def recent(self, session_id: uuid.UUID, agent: str | None) -> list[Tip]:
        try:
            found = self._redis.lrange(self._key(session_id, agent), 0, TIPS_PER_AGENT - 1)
        except RedisError as exc:
            log.warning("TITO tips: Redis unreachable, reading the session instead: %s", exc)
            return []
        try:
            return [Tip.decode(data) for data in found if isinstance(data, bytes)]  # type: ignore[union-attr]
        except (ValueError, KeyError, TypeError) as exc:  # not a tip this code wrote: the slow path answers
            log.warning("TITO tips: unreadable entry for session %s: %s", session_id, exc)
            return []

    def remember(self, session_id: uuid.UUID, agent: str | None, tip: Tip, keep_s: int) -> None:
        key = self._key(session_id, agent)
        try:
            pipe = self._redis.pipeline()
            pipe.lpush(key, tip.encode())
            pipe.ltrim(key, 0, TIPS_PER_AGENT - 1)
            pipe.expire(key, max(1, keep_s))
            pipe.execute()
        except RedisError as exc:
            log.warning("TITO tips: could not remember call %s: %s", tip.call_id, exc)

    def close(self) -> None:
        self._redis.close()


def tip_store(redis_url: str | None) -> TipStore:
    return RedisTips(redis_url) if redis_url else LocalTips()
