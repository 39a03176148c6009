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
import sqlalchemy as sa

from polar.config import load_config
from polar.fleet.control import REFRESH_S, set_state
from polar.protocols import detect
from polar.proxy import EnginePool, ProxyService
from polar.proxy.keys import hash_key
from polar.proxy.limits import CallLimits, LocalLimiter
from polar.proxy.refusals import RefusalCounter, add_counts, fold_in, refusal_counts
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


def _running_session(database_url: str, tmp_path: Path, **limits: int) -> tuple[uuid.UUID, str]:
    return running_proxy_session(database_url, tmp_path, command_task("limited", "true", **limits))


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
    session_id, key = _running_session(database_url, tmp_path)
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
    session_id, key = _running_session(database_url, tmp_path)
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
    session_id, key = _running_session(database_url, tmp_path)
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
        RefusalCounter(db, redis_url).refused(hash_key(key), None, "database_outage")  # one more while away
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
