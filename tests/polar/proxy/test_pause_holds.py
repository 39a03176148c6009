"""A pause charges what it holds (audit G17): the first call of a session a weight-sync pause refuses (``reject``) or
holds (``wait``) stamps ``sessions.pause_held_at`` with the database's now, once per session per pause; calls while
not paused write nothing; a resume clears every stamp; a database away fails no call. On Postgres, with the proxy in
this process and no engine listening."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
import sqlalchemy as sa

from polar.config import load_config
from polar.fleet.control import REFRESH_S, set_state
from polar.protocols import detect
from polar.proxy import EnginePool, ProxyService
from polar.proxy.limits import LocalLimiter
from polar.proxy.pause_holds import PauseHolds, stamp_held
from polar.proxy.refusals import RefusalCounter
from polar.storage.database import Database
from polar.storage.models import Session
from tests.conftest import redis_database
from tests.live_proxy import running_proxy_session
from tests.processes import wait_until
from tests.stage_calls import command_task

CHAT = detect("POST", "/v1/chat/completions", {}, {})
BODY = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
HANG_GUARD_S = 120.0


@pytest.fixture
def proxy(database_url: str, tmp_path: Path) -> Iterator[ProxyService]:
    with redis_database() as redis_url:
        settings = {"POLAR_DATABASE_URL": database_url, "POLAR_ENGINE_URLS": "http://127.0.0.1:1",
                    "POLAR_SERVED_MODEL": "m", "POLAR_REDIS_URL": redis_url}  # fmt: skip
        config = load_config(settings, cwd=tmp_path)
        engines = EnginePool(config.engine_urls, 5)
        db = Database(database_url)
        try:
            yield ProxyService(config, db, engines, LocalLimiter(), refusals=RefusalCounter(db, redis_url))
        finally:
            engines.close()
            db.dispose()


def held_at(db: Database, session_id: uuid.UUID) -> datetime | None:
    with db.unit() as session:
        return session.scalar(sa.select(Session.pause_held_at).where(Session.id == session_id))


def _call(proxy: ProxyService, key: str) -> int:
    assert CHAT is not None
    return proxy.handle(CHAT, key, None, BODY).status


def test_a_refused_call_marks_its_session_held_once_per_pause(
    proxy: ProxyService, database_url: str, tmp_path: Path
) -> None:
    session_id, key = running_proxy_session(database_url, tmp_path, command_task("t", "true"))
    assert _call(proxy, key) == 502 and held_at(proxy.db, session_id) is None  # not paused: nothing written
    set_state(proxy.db, paused=True, mode="reject")
    assert _call(proxy, key) == 429
    first = held_at(proxy.db, session_id)
    assert first is not None
    assert _call(proxy, key) == 429 and held_at(proxy.db, session_id) == first  # its first refusal counts
    set_state(proxy.db, paused=False)
    assert held_at(proxy.db, session_id) is None  # a resume clears every hold
    time.sleep(REFRESH_S + 0.1)  # the proxy re-reads the control row
    assert _call(proxy, key) == 502 and held_at(proxy.db, session_id) is None
    set_state(proxy.db, paused=True, mode="reject")
    try:
        assert _call(proxy, key) == 429  # a new pause: held again, later
        again = held_at(proxy.db, session_id)
        assert again is not None and again > first
    finally:
        set_state(proxy.db, paused=False)


def test_a_call_held_in_wait_mode_marks_its_session_as_it_starts_waiting(
    proxy: ProxyService, database_url: str, tmp_path: Path
) -> None:
    session_id, key = running_proxy_session(database_url, tmp_path, command_task("t", "true"))
    set_state(proxy.db, paused=True, mode="wait")
    statuses: list[int] = []
    waiter = threading.Thread(target=lambda: statuses.append(_call(proxy, key)))
    waiter.start()
    try:
        wait_until(lambda: held_at(proxy.db, session_id) is not None, HANG_GUARD_S, "the held call's mark")
        assert waiter.is_alive() and statuses == []  # still held
    finally:
        set_state(proxy.db, paused=False)
        waiter.join(HANG_GUARD_S)
    assert statuses == [502]  # let through at resume (no engine listens)


def test_a_stamp_lands_only_while_calls_are_paused(database_url: str, tmp_path: Path) -> None:
    session_id, _ = running_proxy_session(database_url, tmp_path, command_task("t", "true"))
    db = Database(database_url)
    try:
        assert not stamp_held(db, session_id)  # a proxy's stale view after a resume writes nothing
        set_state(db, paused=True, mode="reject")
        assert stamp_held(db, session_id) and not stamp_held(db, session_id)  # one stamp per pause
        set_state(db, paused=False)
    finally:
        db.dispose()


def test_a_database_away_fails_no_call_for_the_mark() -> None:
    away = Database("postgresql+psycopg://postgres@127.0.0.1:1/polar")
    try:
        holds = PauseHolds(away)
        holds.held(uuid.uuid4(), None)  # logged, not raised: the call is answered as it would be
    finally:
        away.dispose()
