"""Refused calls are on record (audit F1): the proxy counts every call it turned away before the engine saw it,
per session and reason, in ``call_refusals``; while the database is away, in Redis under the session's proxy key,
folded in at postrun. On Postgres and Redis, with the proxy in this process and no engine listening."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import redis
import sqlalchemy as sa

from polar.config import load_config
from polar.fleet.control import REFRESH_S, set_state
from polar.protocols import detect
from polar.proxy import EnginePool, ProxyService
from polar.proxy.key_misses import KeyMisses
from polar.proxy.keys import hash_key
from polar.proxy.limits import CallLimits, LocalLimiter
from polar.proxy.refusals import (
    INFRASTRUCTURE_REASONS,
    RefusalCounter,
    add_counts,
    declare_key,
    fold_in,
    refusal_counts,
)
from polar.storage.calls.read import pinned_engine
from polar.storage.database import Database
from polar.storage.models import CallRefusal
from tests.conftest import redis_database
from tests.live_proxy import running_proxy_session
from tests.stage_calls import command_task

CHAT = detect("POST", "/v1/chat/completions", {}, {})
BODY = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()


@pytest.fixture
def redis_url() -> Iterator[str]:
    with redis_database() as url:
        yield url


def _proxy(
    database_url: str,
    redis_url: str,
    tmp_path: Path,
    pin_of: Callable[[uuid.UUID], str | None] | None = None,
    **env: str,
) -> tuple[ProxyService, EnginePool]:
    settings = {"POLAR_DATABASE_URL": database_url, "POLAR_ENGINE_URLS": "http://127.0.0.1:1",
                "POLAR_SERVED_MODEL": "m", "POLAR_REDIS_URL": redis_url, **env}  # fmt: skip
    config = load_config(settings, cwd=tmp_path)
    engines = EnginePool(config.engine_urls, 5, pin_of=pin_of)
    db = Database(database_url)
    return ProxyService(config, db, engines, LocalLimiter(), refusals=RefusalCounter(db, redis_url)), engines


def _running_session(
    database_url: str, tmp_path: Path, redis_url: str | None = None, **limits: int
) -> tuple[uuid.UUID, str]:
    """A running session; its key declared to ``redis_url`` as the run stage declares it when it mints it."""
    session_id, key = running_proxy_session(database_url, tmp_path, command_task("limited", "true", **limits))
    declare_key(redis_url, hash_key(key))
    return session_id, key


def test_refused_calls_are_recorded_by_reason(database_url: str, redis_url: str, tmp_path: Path) -> None:
    assert CHAT is not None
    session_id, key = _running_session(database_url, tmp_path, max_concurrent_calls=1, max_calls=2)
    proxy, engines = _proxy(database_url, redis_url, tmp_path)
    try:
        set_state(proxy.db, paused=True, mode="reject")
        statuses = [proxy.handle(CHAT, key, None, BODY).status for _ in range(2)]
        set_state(proxy.db, paused=False)
        time.sleep(REFRESH_S + 0.1)  # the proxy re-reads the control row
        limits = CallLimits(max_concurrent=1, max_calls=2, keep_s=60)
        with proxy.limiter.slot(session_id, limits, counted=False):  # another call of the session in flight
            statuses.append(proxy.handle(CHAT, key, None, BODY).status)
        statuses += [proxy.handle(CHAT, key, None, BODY).status for _ in range(3)]  # engine down twice, then spent
        assert statuses == [429, 429, 429, 502, 502, 429]
        assert refusal_counts(proxy.db, session_id) == {"paused": 2, "max_concurrent_calls": 1, "max_calls": 1}
    finally:
        engines.close()
        proxy.db.dispose()


def test_refusals_while_the_database_is_away_are_counted_in_redis_then_folded_in(
    database_url: str, redis_url: str, tmp_path: Path
) -> None:
    assert CHAT is not None
    session_id, key = _running_session(database_url, tmp_path, redis_url)
    # A proxy whose database cannot be reached: it resolves no key, and answers 503 after POLAR_DB_OUTAGE.
    away = "postgresql+psycopg://postgres@127.0.0.1:1/polar"
    proxy, engines = _proxy(away, redis_url, tmp_path, POLAR_DB_OUTAGE="0.2")
    try:
        statuses = [proxy.handle(CHAT, key, None, BODY).status for _ in range(3)]
    finally:
        engines.close()
        proxy.db.dispose()
    assert statuses == [503, 503, 503]
    db = Database(database_url)
    try:
        assert refusal_counts(db, session_id) == {}
        fold_in(db, redis_url, session_id, hash_key(key))
        assert refusal_counts(db, session_id) == {"database_outage": 3}
        fold_in(db, redis_url, session_id, hash_key(key))  # a second postrun adds nothing
        assert refusal_counts(db, session_id) == {"database_outage": 3}
    finally:
        db.dispose()


def test_the_database_away_while_a_call_finds_its_engine_is_a_refusal_on_record(
    database_url: str, redis_url: str, tmp_path: Path
) -> None:
    """The session's engine pin is read from the database (the call that last served it). A chaos run's Postgres
    restart landed between a call's key lookup and that read: the proxy answered an unhandled 500 with nothing on
    record, and the harness that gave up on it was scored as the policy's failure. It is a database outage."""
    assert CHAT is not None
    session_id, key = _running_session(database_url, tmp_path, redis_url)
    away = Database("postgresql+psycopg://postgres@127.0.0.1:1/polar")  # where the pin lookup finds Postgres gone
    proxy, engines = _proxy(
        database_url, redis_url, tmp_path, lambda sid: pinned_engine(away, sid), POLAR_DB_OUTAGE="0.2"
    )
    db = proxy.db
    try:
        answers = [proxy.handle(CHAT, key, None, BODY) for _ in range(2)]
        assert [a.status for a in answers] == [503, 503]
        assert "could not reach its database" in json.dumps(answers[0].body)
        fold_in(db, redis_url, session_id, hash_key(key))  # counted in Redis, as any outage refusal: postrun's step
        assert refusal_counts(db, session_id) == {"database_outage": 2}
    finally:
        engines.close()
        db.dispose()
        away.dispose()


def test_refusals_counted_in_redis_keep_when_they_happened(database_url: str, redis_url: str, tmp_path: Path) -> None:
    """Postrun orders refusals against the harness's answers (polar.lifecycle.attempts): one counted in Redis while
    the database was away is folded in with the time it happened (the refusing machine's clock), not the fold's;
    a row keeps its earliest first and latest last refusal."""
    assert CHAT is not None
    session_id, key = _running_session(database_url, tmp_path, redis_url)
    away = "postgresql+psycopg://postgres@127.0.0.1:1/polar"
    proxy, engines = _proxy(away, redis_url, tmp_path, POLAR_DB_OUTAGE="0.2")
    try:
        before = datetime.now(UTC)
        statuses = [proxy.handle(CHAT, key, None, BODY).status for _ in range(2)]
        after = datetime.now(UTC)
    finally:
        engines.close()
        proxy.db.dispose()
    assert statuses == [503, 503]
    db = Database(database_url)
    try:
        add_counts(db, session_id, {"database_outage": 1})  # one recorded directly, later than those in Redis
        (recorded_at,) = _times(db, session_id)[1:]
        fold_in(db, redis_url, session_id, hash_key(key))
        assert refusal_counts(db, session_id) == {"database_outage": 3}
        first, last = _times(db, session_id)
        assert before <= first <= after < recorded_at and last == recorded_at  # the fold took Redis's own times
        # One more while away, from a proxy that had placed the key (its fold above took the declaration with it).
        RefusalCounter(db, redis_url).refused(hash_key(key), session_id, "database_outage")
        fold_in(db, redis_url, session_id, hash_key(key))
        assert _times(db, session_id)[1] > recorded_at
    finally:
        db.dispose()


def _times(db: Database, session_id: uuid.UUID) -> tuple[datetime, datetime]:
    with db.unit() as session:
        row = session.execute(
            sa.select(CallRefusal.first_at, CallRefusal.last_at).where(CallRefusal.session_id == session_id)
        ).one()
    return row.first_at, row.last_at


AWAY = "postgresql+psycopg://postgres@127.0.0.1:1/polar"


def _counted_keys(redis_url: str) -> list[bytes]:
    client = redis.Redis.from_url(redis_url)
    try:
        return sorted(client.keys("polar:refusals:*"))
    finally:
        client.close()


def _placed(proxy: ProxyService, session_id: uuid.UUID, key: str, age_s: float) -> None:
    """As if this proxy process had resolved ``key`` to its session ``age_s`` ago (its cache entry long stale)."""
    limits = CallLimits(max_concurrent=4, max_calls=100, keep_s=60)
    proxy.admission._keys[hash_key(key)] = (session_id, limits, "record", time.monotonic() - age_s)


def test_while_the_database_is_away_made_up_keys_leave_nothing_in_redis(
    database_url: str, redis_url: str, tmp_path: Path
) -> None:
    """Audit G21: a refusal counted in Redis made a hash that lived 7 days for every key a request carried. Only a
    session's key is counted now: one the run stage declared, or, undeclared (a session minted before keys were
    declared), one this proxy process had placed before the outage. A flood of made-up keys leaves nothing."""
    assert CHAT is not None
    session_id, key = _running_session(database_url, tmp_path)  # not declared
    proxy, engines = _proxy(AWAY, redis_url, tmp_path, POLAR_DB_OUTAGE="0")
    try:
        _placed(proxy, session_id, key, age_s=3600)
        made_up = [proxy.handle(CHAT, f"pk-made-up-{n}", None, BODY).status for n in range(50)]
        assert set(made_up) == {503}
        assert proxy.handle(CHAT, key, None, BODY).status == 503
    finally:
        engines.close()
        proxy.db.dispose()
    assert _counted_keys(redis_url) == [f"polar:refusals:{{{hash_key(key)}}}".encode()]
    db = Database(database_url)
    try:
        fold_in(db, redis_url, session_id, hash_key(key))
        assert refusal_counts(db, session_id) == {"database_outage": 1}
    finally:
        db.dispose()


def test_a_lookup_held_by_a_flood_is_a_refusal_on_record(database_url: str, redis_url: str, tmp_path: Path) -> None:
    """Audit G4: past its source's budget of unknown keys, a call whose key the proxy does not know gets 429
    (``Busy``). That 429 was on no record, so a harness that gave up on it was scored as the policy's failure. It is
    counted now as ``busy`` (an infrastructure reason, ``polar.lifecycle.attempts``): under the key's hash when the
    proxy cannot place the key (its declaration says it is a session's), directly when this process had placed it."""
    assert CHAT is not None
    session_id, key = _running_session(database_url, tmp_path, redis_url)
    proxy, engines = _proxy(database_url, redis_url, tmp_path)
    proxy.admission._misses = KeyMisses(rate_per_s=0.001, burst=20)  # refilled too slowly to matter here
    flooding = "10.0.0.66"
    try:
        flood = [proxy.handle(CHAT, f"pk-made-up-{n}", None, BODY, flooding).status for n in range(100)]
        assert flood.count(401) == 20 and flood.count(429) == 80
        assert _counted_keys(redis_url) == [f"polar:refusals:{{{hash_key(key)}}}".encode()]  # the declaration alone
        assert proxy.handle(CHAT, key, None, BODY, flooding).status == 429  # its first call, behind the flood
        assert refusal_counts(proxy.db, session_id) == {}
        fold_in(proxy.db, redis_url, session_id, hash_key(key))  # postrun's step
        assert refusal_counts(proxy.db, session_id) == {"busy": 1}
        _placed(proxy, session_id, key, age_s=3600)  # placed here once, stale past serving while lookups are held
        assert proxy.handle(CHAT, key, None, BODY, flooding).status == 429
        assert refusal_counts(proxy.db, session_id) == {"busy": 2}  # recorded at once: the session is known
        assert "busy" in INFRASTRUCTURE_REASONS
    finally:
        engines.close()
        proxy.db.dispose()
