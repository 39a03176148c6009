"""The calls this proxy process recorded last for each running session, so the next call's parents (the chains its
prompt may extend, the agent's latest call whose ``payload_index`` its payloads are diffed against) come from memory
instead of a SELECT on every call (``polar.storage.calls.write``: one round trip fewer before the answer).

Memory may lag the database, never lead it: an entry holds only committed calls, so a parent taken from it is
always a stored call of the same session, and a delta on it always decodes. What memory can miss is a newer call
another proxy process recorded: the delta is then taken on an older parent (larger, still exact). The insert's
sequence number says whether that happened: a call numbered one past the last this process saw leaves the entry
trusted; any other number (another process, or calls of this one finishing out of order) marks it stale, and the
next call of the session reads its parents from the database again.
"""

from __future__ import annotations

import threading
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

from polar.storage.prompts import Chain

MAX_SESSIONS = 4096  # least recently recorded sessions are forgotten first
MAX_CHAINS = 64  # as many as the parents query looks at (``write._PARENT_WINDOW``)
# A chain entry's sequence number, read in C: a Python key function (and the UUID hash a lookup by call id costs)
# ran 65 times a call in a session past MAX_CHAINS calls.
_SEQ = itemgetter(0)


@dataclass(frozen=True)
class Latest:
    """An agent's latest stored call, as far as payload deltas need it."""

    id: uuid.UUID
    seq: int
    payload_index: Any


@dataclass
class _Session:
    chains: dict[uuid.UUID, tuple[int, Chain]] = field(default_factory=dict)  # by call id: (seq, chain)
    latest: dict[str | None, Latest] = field(default_factory=dict)  # by agent
    last_seq: int = 0
    trusted: bool = True


class RecentCalls:
    """Per session: the recent chains and each agent's latest call, as this process recorded them."""

    def __init__(self, max_sessions: int = MAX_SESSIONS) -> None:
        self._sessions: OrderedDict[uuid.UUID, _Session] = OrderedDict()
        self._max_sessions = max_sessions
        self._lock = threading.Lock()

    def parents(self, session_id: uuid.UUID, agent: str | None) -> tuple[list[Chain], Latest] | None:
        """The chains (oldest first) and ``agent``'s latest call, when memory can stand in for the database: the
        session's entry is trusted and knows this agent. None: read them."""
        with self._lock:
            entry = self._sessions.get(session_id)
            if entry is None or not entry.trusted or agent not in entry.latest:
                return None
            chains = [chain for _, chain in sorted(entry.chains.values(), key=_SEQ)]
            return chains, entry.latest[agent]

    def recorded(
        self,
        session_id: uuid.UUID,
        agent: str | None,
        call: Latest,
        chain: Chain | None,
        read: tuple[list[tuple[int, Chain]], Latest | None] | None,
    ) -> None:
        """A call of ``session_id`` was committed as ``call`` (``chain``: what a later prompt may extend, None for
        a failed or synthesized call). ``read``: the parents the call read from the database, (seq, chain) pairs
        and the agent's latest, which refresh the entry; None when they came from memory."""
        with self._lock:
            entry = self._sessions.get(session_id)
            if entry is None or read is not None:
                entry = entry or _Session()
                chains, latest = read or ([], None)
                entry.chains.update((found.call_id, (seq, found)) for seq, found in chains)
                if latest is not None and (agent not in entry.latest or entry.latest[agent].seq < latest.seq):
                    entry.latest[agent] = latest
                entry.trusted = True
            elif call.seq != entry.last_seq + 1:
                entry.trusted = False  # a call this process did not see was numbered in between
            entry.last_seq = max(entry.last_seq, call.seq)
            if chain is not None:
                entry.chains[chain.call_id] = (call.seq, chain)
                if len(entry.chains) > MAX_CHAINS:
                    del entry.chains[min(entry.chains.values(), key=_SEQ)[1].call_id]
            if agent not in entry.latest or entry.latest[agent].seq < call.seq:
                entry.latest[agent] = call
            self._sessions[session_id] = entry
            self._sessions.move_to_end(session_id)
            while len(self._sessions) > self._max_sessions:
                self._sessions.popitem(last=False)

    def forget(self, session_id: uuid.UUID) -> None:
        """The session stopped running: its calls are no longer parents of anything."""
        with self._lock:
            self._sessions.pop(session_id, None)
