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
any of them, so with Redis the tips are shared (``RedisTips``: one hash per session, an agent's tips in one field,
expiring with the session's call counts). Without Redis (embedded mode) they are this process's own (``LocalTips``).

Agent labels are the harness's to choose (``/a/<agent>``, ``X-Polar-Agent``), one per call if it likes, so both
stores bound each session: at most ``MAX_AGENTS_PER_SESSION`` agents with tips and ``MAX_BYTES_PER_SESSION`` bytes
of them (Redis: the stored tips, 4 bytes an id plus a short header; local: their ids). Past either bound the
session's agent whose tips were remembered longest ago loses all of them, never only some, so the tips an agent has
are always its latest calls; a pair of tips over the bytes keeps only the newest, and a tip over them alone is not
kept. The local store is bounded in all by ``LOCAL_MAX_TOKENS`` too (least recently used (session, agent) first).
A tip that is missing (evicted, expired, Redis away) costs only the slow path (``tito.find_link`` reads the
session's stored calls), never a wrong link.
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
# A session's tips: room for the two latest tips of 16 agents at 60k tokens, or of 8 at 120k (audit G12: one fresh
# label a call kept one 160 KB tip per call, up to 320 MB a session).
MAX_AGENTS_PER_SESSION = 16
MAX_BYTES_PER_SESSION = 8 * 1024 * 1024
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


def _nbytes(tips: Sequence[Tip]) -> int:
    return sum(t.tokens.itemsize * len(t.tokens) for t in tips)


class LocalTips:
    """This process's tips: per session the agent remembered longest ago evicted past ``max_agents`` or
    ``max_bytes``, and the least recently used (session, agent) past ``max_tokens`` in all."""

    def __init__(
        self,
        max_tokens: int = LOCAL_MAX_TOKENS,
        max_agents: int = MAX_AGENTS_PER_SESSION,
        max_bytes: int = MAX_BYTES_PER_SESSION,
    ) -> None:
        self.max_tokens, self.max_agents, self.max_bytes = max_tokens, max_agents, max_bytes
        self._tips: OrderedDict[tuple[uuid.UUID, str | None], list[Tip]] = OrderedDict()
        # Per session: each agent's bytes of tips, the one remembered longest ago first.
        self._sessions: dict[uuid.UUID, OrderedDict[str | None, int]] = {}
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
            kept = [tip, *self._drop((session_id, agent))][:TIPS_PER_AGENT]
            if _nbytes(kept) > self.max_bytes:
                kept = kept[:1]
            if _nbytes(kept) > self.max_bytes:
                return  # over the session's bound alone: the next call takes the slow path
            self._tips[(session_id, agent)] = kept
            self._tokens += sum(len(t.tokens) for t in kept)
            agents = self._sessions.setdefault(session_id, OrderedDict())
            agents[agent] = _nbytes(kept)
            # The agent just remembered is last in line, and alone it fits: these loops end before reaching it.
            while len(agents) > self.max_agents or sum(agents.values()) > self.max_bytes:
                self._drop((session_id, next(iter(agents))))
            while self._tokens > self.max_tokens and len(self._tips) > 1:
                self._drop(next(iter(self._tips)))

    def _drop(self, key: tuple[uuid.UUID, str | None]) -> list[Tip]:
        """Forget one (session, agent)'s tips; what they were."""
        dropped = self._tips.pop(key, [])
        self._tokens -= sum(len(t.tokens) for t in dropped)
        agents = self._sessions.get(key[0])
        if agents is not None:
            agents.pop(key[1], None)
            if not agents:
                del self._sessions[key[0]]
        return dropped

    def agents(self, session_id: uuid.UUID) -> int:
        """How many of the session's agents have tips here."""
        with self._lock:
            return len(self._sessions.get(session_id, ()))

    def __len__(self) -> int:
        return len(self._tips)


# KEYS: the session's tips hash (agent field -> its tips, newest first, each framed ``<length>:<bytes>``), its agents
# sorted set (scored in the order each was last remembered). ARGV: agent field, the new tip, tips per agent, max
# agents, max bytes, keep_s. Returns the number of agents evicted, or -1 when the tip alone is over max bytes.
_REMEMBER = """
local hash, order, field, tip = KEYS[1], KEYS[2], ARGV[1], ARGV[2]
local per_agent, max_agents, max_bytes = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local newest = #tip .. ':' .. tip
local packed = newest
local old = redis.call('HGET', hash, field)
if old then
  local pos, kept = 1, 1
  while kept < per_agent and pos <= #old do
    local colon = string.find(old, ':', pos, true)
    local length = colon and tonumber(string.sub(old, pos, colon - 1))
    if not length then break end
    pos, kept = colon + length + 1, kept + 1
  end
  packed = packed .. string.sub(old, 1, pos - 1)
end
if #packed > max_bytes then packed = newest end
if #packed > max_bytes then
  redis.call('HDEL', hash, field)
  redis.call('ZREM', order, field)
  return -1
end
redis.call('HSET', hash, field, packed)
local top = redis.call('ZRANGE', order, -1, -1, 'WITHSCORES')[2]
redis.call('ZADD', order, (tonumber(top) or 0) + 1, field)
redis.call('EXPIRE', hash, ARGV[6])
redis.call('EXPIRE', order, ARGV[6])
local total = 0
for _, name in ipairs(redis.call('HKEYS', hash)) do total = total + redis.call('HSTRLEN', hash, name) end
local evicted = 0
while redis.call('ZCARD', order) > max_agents or total > max_bytes do
  local oldest = redis.call('ZRANGE', order, 0, 0)[1]
  if not oldest or oldest == field then break end
  total = total - redis.call('HSTRLEN', hash, oldest)
  redis.call('HDEL', hash, oldest)
  redis.call('ZREM', order, oldest)
  evicted = evicted + 1
end
return evicted
"""


def _unframed(packed: bytes) -> list[bytes]:
    """The tips ``_REMEMBER`` packed into one field, newest first."""
    found: list[bytes] = []
    pos = 0
    while pos < len(packed) and len(found) < TIPS_PER_AGENT:
        colon = packed.index(b":", pos)
        end = colon + 1 + int(packed[pos:colon])
        found.append(packed[colon + 1 : end])
        pos = end
    return found


class RedisTips:
    """Tips shared by every proxy process: per session one hash of each agent's tips (newest first) and a sorted
    set of when each agent's were remembered, both expiring ``keep_s`` after the session's last call and bounded
    by ``max_agents`` and ``max_bytes`` in one script. While Redis is unreachable nothing is remembered and nothing
    found (the slow path answers)."""

    def __init__(
        self, redis_url: str, max_agents: int = MAX_AGENTS_PER_SESSION, max_bytes: int = MAX_BYTES_PER_SESSION
    ) -> None:
        self.max_agents, self.max_bytes = max_agents, max_bytes
        self._redis = redis.Redis.from_url(
            redis_url, socket_timeout=REDIS_TIMEOUT_S, socket_connect_timeout=REDIS_TIMEOUT_S
        )
        self._remember = self._redis.register_script(_REMEMBER)

    @staticmethod
    def _keys(session_id: uuid.UUID) -> tuple[str, str]:
        # One hash tag per session: both keys land on the same node of a Redis Cluster.
        return f"polar:tito:tips:{{{session_id}}}", f"polar:tito:tips:{{{session_id}}}:agents"

    @staticmethod
    def _field(agent: str | None) -> str:
        return hashlib.blake2b(agent.encode(), digest_size=8).hexdigest() if agent is not None else "-"

    def recent(self, session_id: uuid.UUID, agent: str | None) -> list[Tip]:
        try:
            found = self._redis.hget(self._keys(session_id)[0], self._field(agent))
        except RedisError as exc:
            log.warning("TITO tips: Redis unreachable, reading the session instead: %s", exc)
            return []
        if not isinstance(found, bytes):
            return []
        try:
            return [Tip.decode(data) for data in _unframed(found)]
        except (ValueError, KeyError, TypeError) as exc:  # not a tip this code wrote: the slow path answers
            log.warning("TITO tips: unreadable entry for session %s: %s", session_id, exc)
            return []

    def remember(self, session_id: uuid.UUID, agent: str | None, tip: Tip, keep_s: int) -> None:
        args: list[bytes | str | int] = [
            self._field(agent),
            tip.encode(),
            TIPS_PER_AGENT,
            self.max_agents,
            self.max_bytes,
            max(1, keep_s),
        ]
        try:
            self._remember(keys=self._keys(session_id), args=args)
        except RedisError as exc:
            log.warning("TITO tips: could not remember call %s: %s", tip.call_id, exc)

    def agents(self, session_id: uuid.UUID) -> int:
        """How many of the session's agents have tips in Redis."""
        return int(self._redis.hlen(self._keys(session_id)[0]))  # type: ignore[arg-type]

    def close(self) -> None:
        self._redis.close()


def tip_store(redis_url: str | None) -> TipStore:
    return RedisTips(redis_url) if redis_url else LocalTips()
