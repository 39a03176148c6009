"""What ``ProxyService`` records on its metrics for calls that never reach an engine's answer: every answer by
protocol, operation and status; the refusals (paused, over max_concurrent_calls, over max_calls) by reason. On
Postgres, with the proxy in this process and an engine address nothing listens on."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from polar.config import load_config
from polar.fleet.control import REFRESH_S, set_state
from polar.observability import ProxyMetrics, exposition
from polar.protocols import detect
from polar.proxy import EnginePool, ProxyService
from polar.proxy.limits import CallLimits, LocalLimiter
from tests.live_proxy import running_proxy_session
from tests.prometheus import Scrape, parse
from tests.stage_calls import command_task, domain_services

CHAT = detect("POST", "/v1/chat/completions", {}, {})
BODY = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()


@pytest.fixture
def proxy(database_url: str, tmp_path: Path) -> Iterator[ProxyService]:
    env = {"POLAR_DATABASE_URL": database_url, "POLAR_ENGINE_URLS": "http://127.0.0.1:1", "POLAR_SERVED_MODEL": "m"}
    config = load_config(env, cwd=tmp_path)
    metrics = ProxyMetrics()
    services = domain_services(database_url, tmp_path)
    engines = EnginePool(config.engine_urls, 5, metrics=metrics)
    yield ProxyService(config, services.db, engines, LocalLimiter(), metrics)
    engines.close()
    services.db.dispose()


def running_session(proxy: ProxyService, **limits: int) -> tuple[uuid.UUID, str]:
    task = command_task("limited", "true", **limits)
    return running_proxy_session(proxy.config.database_url, Path(proxy.config.state_dir), task)


def scraped(proxy: ProxyService) -> Scrape:
    return parse(exposition(proxy.metrics.registry)[0].decode())


def test_refusals_and_failures_are_counted_by_reason_and_status(proxy: ProxyService) -> None:
    assert CHAT is not None
    session_id, key = running_session(proxy, max_concurrent_calls=1, max_calls=2)
    statuses = [proxy.handle(CHAT, "pk-unknown", None, BODY).status]
    set_state(proxy.db, paused=True, mode="reject")
    statuses.append(proxy.handle(CHAT, key, None, BODY).status)
    set_state(proxy.db, paused=False)
    time.sleep(REFRESH_S + 0.1)  # the proxy re-reads the control row
    limits = CallLimits(max_concurrent=1, max_calls=2, keep_s=60)
    with proxy.limiter.slot(session_id, limits, counted=False):  # another call of the session in flight
        statuses.append(proxy.handle(CHAT, key, None, BODY).status)
    statuses += [proxy.handle(CHAT, key, None, BODY).status for _ in range(3)]  # engine down twice, then spent
    assert statuses == [401, 429, 429, 502, 502, 429]

    found = scraped(proxy)
    statuses_seen = found.labels("polar_proxy_requests_total", "status")
    by_status = {s: found.value("polar_proxy_requests_total", status=s) for s in statuses_seen}
    assert by_status == {"401": 1, "429": 3, "502": 2}
    assert found.value("polar_proxy_requests_total", protocol="openai_chat", operation="generate") == 6
    assert {
        reason: found.value("polar_proxy_rejected_calls_total", protocol="openai_chat", reason=reason)
        for reason in ("paused", "max_concurrent_calls", "max_calls")
    } == {"paused": 1, "max_concurrent_calls": 1, "max_calls": 1}
    # No engine answered: nothing to time, no tokens; the engine's gauge is back at 0.
    assert found.value("polar_proxy_request_duration_seconds_count") == 0
    assert found.value("polar_proxy_prompt_tokens_total") == 0
    assert found.value("polar_engine_inflight_calls", engine="http://127.0.0.1:1") == 0
