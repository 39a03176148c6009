"""A TITO call finds the call it continues without reading its session back (audit F18): the proxy remembers each
answered call as its agent's chain tip (``polar.proxy.tito_tips``), shared through Redis by every proxy process, and
reads the session only when no tip fits. Counted, not timed: the rows the lookup reads per call stay at zero as the
session grows. On Postgres and Redis, with the proxy in this process and the reference engine (echo policy)."""

from __future__ import annotations

import json
import uuid
from array import array
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import sqlalchemy as sa

from polar.config import load_config
from polar.local.launcher import Stack, engine_spec, free_port
from polar.protocols import detect
from polar.proxy import EnginePool, ProxyService, asker, tito
from polar.proxy.limits import LocalLimiter
from polar.proxy.tito_tips import MAX_AGENTS_PER_SESSION, MAX_BYTES_PER_SESSION, LocalTips, RedisTips, Tip
from polar.storage.database import Database
from tests.conftest import redis_database
from tests.live_proxy import running_proxy_session
from tests.stacks import _live
from tests.stage_calls import command_task

CHAT = detect("POST", "/v1/chat/completions", {}, {})
CALLS = 12


@pytest.fixture(scope="module")
def engine_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    with _live(Stack([engine_spec(port, "echo")], {}, tmp_path_factory.mktemp("tips") / "logs")):
        yield f"http://127.0.0.1:{port}"


@pytest.fixture
def redis_url() -> Iterator[str]:
    with redis_database() as url:
        yield url


def _proxy(database_url: str, engine_url: str, tmp_path: Path, redis_url: str | None) -> ProxyService:
    settings = {"POLAR_DATABASE_URL": database_url, "POLAR_ENGINE_URLS": engine_url}
    settings["POLAR_SERVED_MODEL"] = "polar-reference"
    if redis_url:
        settings["POLAR_REDIS_URL"] = redis_url
    config = load_config(settings, cwd=tmp_path)
    return ProxyService(config, Database(database_url), EnginePool(config.engine_urls, 30), LocalLimiter())


def _tito_session(database_url: str, tmp_path: Path) -> tuple[uuid.UUID, str]:
    return running_proxy_session(database_url, tmp_path, command_task("tito", "true", token_in_token_out=True))


class _RowsRead:
    """Counts the ``model_calls`` rows the TITO lookup reads (it reads them through ``session_rows``)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.rows = 0
        real = tito.session_rows

        def counted(*args: Any, **kwargs: Any) -> list[Any]:
            found = real(*args, **kwargs)
            self.rows += len(found)
            return found

        monkeypatch.setattr(tito, "session_rows", counted)


def _converse(proxies: list[ProxyService], key: str, reads: _RowsRead) -> list[int]:
    """``CALLS`` turns of one conversation, turn n through ``proxies[n % len(proxies)]`` (gunicorn workers take a
    session's calls in any order); the rows the lookup read at each call."""
    assert CHAT is not None
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are terse."}]
    per_call = []
    for turn in range(CALLS):
        messages.append({"role": "user", "content": f"question number {turn}"})
        before = reads.rows
        body = json.dumps({"model": "polar-reference", "messages": messages}).encode()
        answer = proxies[turn % len(proxies)].handle(CHAT, key, None, body)
        assert answer.status == 200, answer.body
        per_call.append(reads.rows - before)
        messages.append({"role": "assistant", "content": answer.body["choices"][0]["message"]["content"]})
    return per_call


def _chain(database_url: str, session_id: uuid.UUID) -> list[tuple[uuid.UUID, str | None]]:
    """Each call's id and the call its TITO request continued (None: rendered from messages)."""
    with Database(database_url).engine.connect() as connection:
        rows = connection.execute(
            sa.text("SELECT id, normalized_request FROM model_calls_full WHERE session_id = :s ORDER BY seq"),
            {"s": session_id},
        ).all()
    return [(row.id, ((row.normalized_request or {}).get("polar_tito") or {}).get("chain_call_id")) for row in rows]


@pytest.mark.parametrize("shared", [False, True], ids=["one-process", "two-processes-redis"])
def test_the_lookup_reads_no_rows_however_long_the_session(
    shared: bool, database_url: str, engine_url: str, redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    session_id, key = _tito_session(database_url, tmp_path)
    proxies = [_proxy(database_url, engine_url, tmp_path, redis_url if shared else None) for _ in (1, 2)]
    reads = _RowsRead(monkeypatch)
    try:
        per_call = _converse(proxies if shared else proxies[:1], key, reads)
    finally:
        for proxy in proxies:
            proxy.engines.close()
            proxy.db.dispose()
    assert per_call == [0] * CALLS  # before the tips: 0, 2, 4, … 22 (every earlier call, twice)
    chain = _chain(database_url, session_id)
    assert [link for _, link in chain] == [None, *(str(call_id) for call_id, _ in chain[:-1])]


def test_without_a_tip_the_session_is_read_and_the_chain_still_found(
    database_url: str, engine_url: str, redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tip that expired or that Redis lost costs the slow path, never a wrong or a missing link."""
    session_id, key = _tito_session(database_url, tmp_path)
    proxy = _proxy(database_url, engine_url, tmp_path, redis_url)
    reads = _RowsRead(monkeypatch)
    real = proxy.asker.tips.remember
    forgetting = {"on": False}
    monkeypatch.setattr(proxy.asker.tips, "remember", lambda *a, **k: None if forgetting["on"] else real(*a, **k))
    try:
        forgetting["on"] = True
        per_call = _converse([proxy], key, reads)
    finally:
        proxy.engines.close()
        proxy.db.dispose()
    assert per_call[1:] and all(n > 0 for n in per_call[1:])
    chain = _chain(database_url, session_id)
    assert [link for _, link in chain] == [None, *(str(call_id) for call_id, _ in chain[:-1])]


def _tip(tokens: int) -> Tip:
    return Tip(uuid.uuid4(), frozenset({"x"}), "h", (), array("i", range(tokens)), tokens // 2, "stop")


def test_the_local_store_is_bounded_and_keeps_the_latest_tips() -> None:
    store = LocalTips(max_tokens=1_000)
    sessions = [uuid.uuid4() for _ in range(20)]
    for session_id in sessions:
        for _ in range(3):
            store.remember(session_id, None, _tip(100), 60)
    assert len(store) == 5  # 2 tips of 100 ids each per session, 1,000 ids in all: the 5 latest sessions
    assert store.recent(sessions[0], None) == []
    newest = store.recent(sessions[-1], None)
    assert len(newest) == 2


def test_redis_keeps_the_latest_tips_of_each_agent_until_they_expire(redis_url: str) -> None:
    store, session_id = RedisTips(redis_url), uuid.uuid4()
    first, second, third = _tip(10), _tip(12), _tip(14)
    for one in (first, second, third):
        store.remember(session_id, "agent", one, 60)
    assert [t.call_id for t in store.recent(session_id, "agent")] == [third.call_id, second.call_id]
    assert store.recent(session_id, "agent")[0] == third and store.recent(session_id, None) == []
    client = redis.Redis.from_url(redis_url)
    for key in store._keys(session_id):
        assert 0 < client.ttl(key) <= 60
    store.close()


def _redis_bytes(redis_url: str, store: RedisTips, session_id: uuid.UUID) -> int:
    """The bytes of tips Redis holds for the session."""
    client, key = redis.Redis.from_url(redis_url), store._keys(session_id)[0]
    return sum(int(client.hstrlen(key, name)) for name in client.hkeys(key))


@pytest.mark.parametrize("backend", ["local", "redis"])
def test_a_fresh_agent_label_a_call_keeps_only_the_latest_agents_tips(backend: str, redis_url: str) -> None:
    """Audit G12: a harness that sends each call under a new agent label kept one tip per call for hours (160 KB
    each at 40k tokens: 320 MB a session). Now a session keeps tips for at most ``MAX_AGENTS_PER_SESSION`` agents,
    the latest, and other sessions' tips are untouched."""
    store: LocalTips | RedisTips = LocalTips() if backend == "local" else RedisTips(redis_url)
    session_id, other = uuid.uuid4(), uuid.uuid4()
    store.remember(other, "main", _tip(10), 60)
    tips = {f"agent-{n}": _tip(10) for n in range(3 * MAX_AGENTS_PER_SESSION)}
    for agent, one in tips.items():
        store.remember(session_id, agent, one, 60)
    assert store.agents(session_id) == MAX_AGENTS_PER_SESSION
    kept = [agent for agent in tips if store.recent(session_id, agent)]
    assert kept == list(tips)[-MAX_AGENTS_PER_SESSION:]
    assert store.recent(session_id, list(tips)[-1]) == [tips[list(tips)[-1]]]
    assert [t.call_id for t in store.recent(other, "main")] and store.agents(other) == 1
    if isinstance(store, RedisTips):
        store.close()


@pytest.mark.parametrize("backend", ["local", "redis"])
def test_a_session_holds_at_most_its_bytes_of_tips(backend: str, redis_url: str) -> None:
    """40k-token tips (160 KB) under fresh labels: the session's tips stay within ``MAX_BYTES_PER_SESSION``; the
    agents remembered last keep theirs."""
    store: LocalTips | RedisTips = LocalTips() if backend == "local" else RedisTips(redis_url)
    session_id = uuid.uuid4()
    tokens = 40_000
    agents = [f"agent-{n}" for n in range(MAX_AGENTS_PER_SESSION)]
    for agent in agents:  # two tips each: 320 KB an agent, 16 agents 5 MB
        store.remember(session_id, agent, _tip(tokens), 60)
        store.remember(session_id, agent, _tip(tokens), 60)
    big = 3 * tokens  # 480 KB a tip, 960 KB an agent
    for agent in agents[:8]:
        store.remember(session_id, agent, _tip(big), 60)
        store.remember(session_id, agent, _tip(big), 60)
    # 8 agents of big tips (7.7 MB) and 8 of small ones (2.6 MB) are over 8 MiB: of the small ones, remembered
    # longest ago, the 2 that still fit stay (the last two).
    assert store.agents(session_id) == 10
    assert all(len(store.recent(session_id, agent)) == 2 for agent in [*agents[:8], *agents[-2:]])
    assert all(store.recent(session_id, agent) == [] for agent in agents[8:-2])
    if isinstance(store, RedisTips):
        assert _redis_bytes(redis_url, store, session_id) <= MAX_BYTES_PER_SESSION
        store.close()
    else:
        held = sum(4 * len(t.tokens) for agent in agents for t in store.recent(session_id, agent))
        assert held <= MAX_BYTES_PER_SESSION


@pytest.mark.parametrize("backend", ["local", "redis"])
def test_a_tip_over_the_session_bound_alone_is_not_kept(backend: str, redis_url: str) -> None:
    """Two tips over the bytes keep only the newest; one over them alone is not kept (the slow path answers)."""
    bound = 4 * 1_000 + 200  # one 1,000-id tip (with Redis's header) fits, two do not
    store = LocalTips(max_bytes=bound) if backend == "local" else RedisTips(redis_url, max_bytes=bound)
    session_id, first, second = uuid.uuid4(), _tip(1_000), _tip(1_000)
    store.remember(session_id, "a", first, 60)
    store.remember(session_id, "a", second, 60)
    assert store.recent(session_id, "a") == [second]
    store.remember(session_id, "a", _tip(2_000), 60)
    assert store.recent(session_id, "a") == [] and store.agents(session_id) == 0
    if isinstance(store, RedisTips):
        store.close()


def test_the_tito_switch_is_remembered_for_a_bounded_number_of_sessions(
    database_url: str, engine_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Audit F21: the per-session TITO switch was cached for every session a process ever served."""
    monkeypatch.setattr(asker, "TITO_FLAGS_SIZE", 3)
    proxy = _proxy(database_url, engine_url, tmp_path, None)
    try:
        for _ in range(10):
            assert proxy.asker.tito_enabled(uuid.uuid4()) is False  # an unknown session: no TITO
            assert len(proxy.asker._tito) <= 3  # before: 10 entries, one per session ever asked about
    finally:
        proxy.engines.close()
        proxy.db.dispose()


def test_an_evicted_tip_costs_the_slow_path_never_a_wrong_link(
    database_url: str, engine_url: str, redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two agents take turns in a session that keeps one agent's tips: each call finds its agent's tip evicted by
    the other's, reads the session instead, and still continues its own agent's previous call."""
    session_id, key = _tito_session(database_url, tmp_path)
    proxy = _proxy(database_url, engine_url, tmp_path, redis_url)
    proxy.asker.tips = RedisTips(redis_url, max_agents=1)
    reads = _RowsRead(monkeypatch)
    conversations: dict[str, list[dict[str, Any]]] = {a: [{"role": "system", "content": a}] for a in ("a", "b")}
    per_call = []
    try:
        for turn in range(8):
            agent = "ab"[turn % 2]
            messages = conversations[agent]
            messages.append({"role": "user", "content": f"question number {turn}"})
            before = reads.rows
            body = json.dumps({"model": "polar-reference", "messages": messages}).encode()
            answer = proxy.handle(CHAT, key, agent, body)
            assert answer.status == 200, answer.body
            per_call.append(reads.rows - before)
            messages.append({"role": "assistant", "content": answer.body["choices"][0]["message"]["content"]})
    finally:
        proxy.engines.close()
        proxy.db.dispose()
    assert all(n > 0 for n in per_call[2:])  # every tip it needed was evicted: the session was read
    with Database(database_url).engine.connect() as connection:
        rows = connection.execute(
            sa.text("SELECT id, agent, normalized_request FROM model_calls_full WHERE session_id = :s ORDER BY seq"),
            {"s": session_id},
        ).all()
    for agent in ("a", "b"):
        own = [row for row in rows if row.agent == agent]
        links = [((row.normalized_request or {}).get("polar_tito") or {}).get("chain_call_id") for row in own]
        assert links == [None, *(str(row.id) for row in own[:-1])]
