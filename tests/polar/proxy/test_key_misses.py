"""Unknown proxy keys cost Postgres a bounded amount (AUDIT F13): a key found unknown is refused again without a
query, and lookups that find nothing are held to a rate, past which a key the proxy does not know gets 429 while
the keys of running sessions still get through. Queries are counted, never timed."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from polar.config import load_config
from polar.protocols import detect
from polar.proxy import EnginePool, ProxyService
from polar.proxy.key_misses import BURST, KeyMisses
from polar.proxy.limits import LocalLimiter
from tests.polar.proxy.test_service_metrics import running_session
from tests.stage_calls import domain_services

MODELS = detect("GET", "/v1/models", {}, {})


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_misses_are_remembered_and_held_to_their_rate() -> None:
    clock = Clock()
    misses = KeyMisses(rate_per_s=10, burst=3, clock=clock)
    for n in range(3):
        assert misses.may_look_up()
        misses.missed(f"k{n}")
    assert not misses.may_look_up()  # the burst is spent
    assert misses.known_unknown("k0") and not misses.known_unknown("new")
    clock.now += 0.1  # one lookup's worth at 10/s
    assert misses.may_look_up()
    misses.missed("k3")
    assert not misses.may_look_up()
    clock.now += 3600  # remembered unknown keys are forgotten in time; the budget refills to its burst
    assert not misses.known_unknown("k0") and misses.may_look_up()


@pytest.fixture
def proxy(database_url: str, tmp_path: Path) -> Iterator[ProxyService]:
    env = {"POLAR_DATABASE_URL": database_url, "POLAR_ENGINE_URLS": "http://127.0.0.1:1", "POLAR_SERVED_MODEL": "m"}
    config = load_config(env, cwd=tmp_path)
    services = domain_services(database_url, tmp_path)
    engines = EnginePool(config.engine_urls, 5)
    yield ProxyService(config, services.db, engines, LocalLimiter())
    engines.close()
    services.db.dispose()


def test_a_flood_of_unknown_keys_makes_a_bounded_number_of_queries(proxy: ProxyService) -> None:
    assert MODELS is not None
    _, key = running_session(proxy)
    assert proxy.handle(MODELS, key, None, b"").status == 200  # known to this proxy before the flood
    queries: list[str] = []
    sa.event.listen(proxy.db.engine, "before_cursor_execute", lambda *args: queries.append(args[2]))
    same = [proxy.handle(MODELS, "pk-made-up", None, b"").status for _ in range(50)]
    assert set(same) == {401} and len(queries) == 1  # asked once, then remembered
    flood = [proxy.handle(MODELS, f"pk-made-up-{n}", None, b"") for n in range(1000)]
    statuses = [answer.status for answer in flood]
    # About BURST lookups found nothing (plus what the budget refilled meanwhile); the rest were not asked.
    assert statuses.count(401) <= BURST + 100 and statuses.count(429) >= 800, statuses.count(401)
    assert len(queries) == 1 + statuses.count(401)
    print(f"1,000 made-up keys: {len(queries) - 1} queries, {statuses.count(429)} answered 429")
    refused = next(answer for answer in flood if answer.status == 429)
    assert refused.headers["Retry-After"] == "1" and "unknown proxy keys" in json.dumps(refused.body)
    stale = time.monotonic() - 1  # its cache entry went stale meanwhile
    proxy.admission._keys = {key_hash: (*entry[:3], stale) for key_hash, entry in proxy.admission._keys.items()}
    assert proxy.handle(MODELS, key, None, b"").status == 200  # a running session keeps calling during the flood
