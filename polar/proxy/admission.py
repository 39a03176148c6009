"""Who may call, and when: a proxy key's running session with its call limits (cached briefly; unknown keys
remembered and their lookups rate-limited per source, ``polar.proxy.key_misses``), and the weight-sync pause a new
call waits behind or is refused by (a call the pause refuses or holds marks its session held, so its budget stands
still: ``polar.proxy.pause_holds``)."""

from __future__ import annotations

import time
import uuid

from polar.config import Config
from polar.contract.states import State
from polar.errors import Busy, EnginePaused, SessionNotRunning, Unauthorized
from polar.fleet.control import ControlState, ControlView
from polar.proxy.key_misses import STALE_S, KeyMisses
from polar.proxy.key_owner import session_state_for_key
from polar.proxy.keys import hash_key
from polar.proxy.limits import CallLimits
from polar.proxy.pause_holds import PauseHolds
from polar.storage.database import Database
from polar.storage.outage import ride_out_or_refuse

KEY_CACHE_S = 5.0
KEY_CACHE_SIZE = 100_000


class Admission:
    def __init__(self, config: Config, db: Database) -> None:
        self.config = config
        self.db = db
        self._keys: dict[str, tuple[uuid.UUID, CallLimits, str, float]] = {}
        self._misses = KeyMisses()
        self.control = ControlView(db, config.pause_max_waiters)
        self.holds = PauseHolds(db)

    def session_for_key(self, key: str | None, source: str | None = None) -> tuple[uuid.UUID, CallLimits, str]:
        """The running session a key belongs to, with its call limits and sampling mode, for a request from
        ``source`` (its peer address: whose budget a lookup that finds nothing spends). Positive answers are cached
        briefly: a key never changes session, and a session that stopped running is caught again when its call is
        recorded."""
        if not key:
            raise Unauthorized("no proxy key: use the session base URL /s/<key>/… or send the key as the API key")
        key_hash = hash_key(key)
        cached = self._keys.get(key_hash)
        now = time.monotonic()
        if cached is not None and cached[3] > now:
            return cached[0], cached[1], cached[2]
        if self._misses.known_unknown(key_hash):
            raise Unauthorized("unknown proxy key")
        if not self._misses.may_look_up(source):  # a flood of made-up keys: no query for a key not known here
            if cached is not None and cached[3] + STALE_S > now:
                return cached[0], cached[1], cached[2]
            raise Busy("this proxy is refusing a flood of unknown proxy keys; retry shortly", retry_after_s=1)
        found = ride_out_or_refuse(lambda: session_state_for_key(self.db, key_hash), self.config.db_outage_s)
        if found is None:
            self._misses.missed(key_hash, source)
            raise Unauthorized("unknown proxy key")
        if found.state != State.RUNNING.value:
            raise SessionNotRunning(f"this session is {found.state}; its proxy key no longer accepts calls")
        limits = CallLimits.of_task(
            self.config, found.max_concurrent_calls, found.max_calls, found.timeout_seconds, found.over_budget
        )
        sampling_mode = found.sampling or "record"
        if len(self._keys) > KEY_CACHE_SIZE:
            self._keys.clear()
        self._keys[key_hash] = (found.session_id, limits, sampling_mode, time.monotonic() + KEY_CACHE_S)
        return found.session_id, limits, sampling_mode

    def known_session(self, key_hash: str) -> uuid.UUID | None:
        """The session this process last resolved ``key_hash`` to, however long ago (a key never changes
        session), or None: who a call refused before its key was looked up belongs to."""
        cached = self._keys.get(key_hash)
        return cached[0] if cached is not None else None

    def admitted(self, session_id: uuid.UUID) -> ControlState:
        """The engine control state a new call runs under; raises while calls are held and the mode rejects."""
        state = self.control.current()
        if not state.paused:
            return state
        self.holds.held(session_id, self.control.paused_at)
        if state.mode == "wait":
            state = self.control.wait_until_resumed(self.config.engine_timeout_s)
            if state.paused:  # gave up waiting (perhaps under a later pause than the one it began in)
                self.holds.held(session_id, self.control.paused_at)
        if state.paused:
            raise EnginePaused("model calls are paused while the trainer syncs weights; retry shortly")
        return state

    def held_by_pause(self, policy_version: str | None) -> bool:
        """Whether a weight-sync pause may have held a call that started under ``policy_version`` in the engines:
        calls are paused now, or the policy version moved on since."""
        state = self.control.current()
        return state.paused or state.policy_version != policy_version
