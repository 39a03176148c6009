"""Unknown proxy keys cost Postgres a bounded amount (AUDIT F13): a key found unknown is refused again without a
query, and lookups that find nothing are held to a rate, past which a key the proxy does not know gets 429 while
the keys of running sessions still get through. The rate is per source (AUDIT G4): one source's flood holds no other
source's first calls. Queries are counted, never timed."""

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


def test_each_source_has_its_own_budget_and_the_process_one_bounds_them_all() -> None:
    clock = Clock()
    misses = KeyMisses(rate_per_s=10, burst=2, clock=clock, process_rate_per_s=10, process_burst=4, sources=2)
    misses.missed("a0", "10.0.0.1")
    misses.missed("a1", "10.0.0.1")
    assert not misses.may_look_up("10.0.0.1")  # the flooding source's burst is spent ...
    assert misses.may_look_up("10.0.0.2")  # ... and no other source's
    misses.missed("b0", "10.0.0.2")
    misses.missed("c0", "10.0.0.3")  # a third source: the least recently seen (10.0.0.1) is forgotten
    assert len(misses._sources) == 2
    assert not misses.may_look_up("10.0.0.3")  # its own budget is left, the process's (4) is spent
    clock.now += 0.1  # one lookup's worth of the process's budget
    assert misses.may_look_up("10.0.0.1")  # forgotten, it starts again with a full burst, bounded by the process


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


def test_a_flood_from_one_source_holds_no_other_sources_first_calls(proxy: ProxyService) -> None:
    """Audit G4: the budget was the process's, so a flood from one sandbox got every other session's first call on
    that proxy process a 429. Only calls from the flooding source wait now."""
    assert MODELS is not None
    proxy.admission._misses = KeyMisses(rate_per_s=0.001, burst=20)  # refilled too slowly to matter here
    flooding, other = "10.0.0.66", "10.0.0.7"
    flood = [proxy.handle(MODELS, f"pk-made-up-{n}", None, b"", flooding).status for n in range(100)]
    assert flood.count(401) == 20 and flood.count(429) == 80
    _, key = running_session(proxy)
    assert proxy.handle(MODELS, key, None, b"", flooding).status == 429  # a first call behind the flood waits
    assert proxy.handle(MODELS, key, None, b"", other).status == 200  # one from elsewhere is looked up
    assert proxy.handle(MODELS, "pk-made-up-more", None, b"", other).status == 401
