"""The series each kind of process records: names and labels as docs/metrics.md lists them, values that follow
what happened, and an exposition ``prometheus_client``'s parser reads."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from polar.observability import ApiMetrics, ProxyMetrics, StageMetrics, exposition
from polar.proxy.engines import EnginePool
from tests.prometheus import Scrape, parse


def scraped(registry: object) -> Scrape:
    body, content_type = exposition(registry)  # type: ignore[arg-type]
    assert content_type.startswith("text/plain; version=0.0.4")
    return parse(body.decode())


def test_proxy_series_count_calls_phases_tokens_and_refusals() -> None:
    metrics = ProxyMetrics()
    metrics.answered("openai_chat", "generate", 200)
    metrics.answered("openai_chat", "generate", 200)
    metrics.answered("anthropic", "generate", 429)
    metrics.timed("openai_chat", engine_s=0.5, capture_s=0.01, total_s=0.6)
    metrics.tokens("openai_chat", prompt=120, completion=7)
    metrics.refused("anthropic", "paused")

    scrape = scraped(metrics.registry)
    assert scrape.families["polar_proxy_requests"] == "counter"
    assert scrape.value("polar_proxy_requests_total", protocol="openai_chat", status="200") == 2
    assert scrape.value("polar_proxy_requests_total", protocol="anthropic", operation="generate", status="429") == 1
    assert scrape.families["polar_proxy_request_duration_seconds"] == "histogram"
    for phase in ("engine", "capture", "proxy", "total"):
        assert scrape.value("polar_proxy_request_duration_seconds_count", protocol="openai_chat", phase=phase) == 1
    # The proxy's own share is what the engine and capture leave of the total.
    assert scrape.value("polar_proxy_request_duration_seconds_sum", phase="proxy") == pytest.approx(0.09)
    assert scrape.value("polar_proxy_request_duration_seconds_bucket", phase="engine", le="0.5") == 1
    assert scrape.value("polar_proxy_request_duration_seconds_bucket", phase="engine", le="0.25") == 0
    assert scrape.value("polar_proxy_prompt_tokens_total", protocol="openai_chat") == 120
    assert scrape.value("polar_proxy_completion_tokens_total", protocol="openai_chat") == 7
    assert scrape.value("polar_proxy_rejected_calls_total", protocol="anthropic", reason="paused") == 1


class _HeldEngine(BaseHTTPRequestHandler):
    """Answers each POST once the test releases it, so a call can be watched while in flight."""

    release = threading.Event()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.release.wait(10)
        body = json.dumps({"ok": True}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def held_engine() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _HeldEngine)
    _HeldEngine.release.clear()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://user:secret@127.0.0.1:{server.server_address[1]}"
    finally:
        _HeldEngine.release.set()
        server.shutdown()
        server.server_close()


def test_engine_inflight_gauge_follows_the_calls_an_engine_holds(held_engine: str) -> None:
    metrics = ProxyMetrics()
    pool = EnginePool([held_engine], timeout_s=10, metrics=metrics)
    shown = held_engine.replace("user:secret@", "")  # the label never carries credentials

    def inflight() -> float:
        return scraped(metrics.registry).value("polar_engine_inflight_calls", engine=shown)

    assert scraped(metrics.registry).has("polar_engine_inflight_calls", engine=shown)  # at 0 from the start
    assert scraped(metrics.registry).value("polar_engine_call_seconds_total", engine=shown) == 0
    calls = [threading.Thread(target=pool.post, args=(uuid.uuid4(), "/v1/x", {}, "m")) for _ in range(2)]
    started = time.monotonic()
    for call in calls:
        call.start()
    try:
        deadline = threading.Event()
        for _ in range(100):
            if inflight() == 2:
                break
            deadline.wait(0.05)
        assert inflight() == 2
        deadline.wait(0.2)
    finally:
        _HeldEngine.release.set()
        for call in calls:
            call.join(10)
        pool.close()
    assert inflight() == 0
    # Two calls held together: their seconds add up (occupancy = rate / max_num_seqs), bounded by what elapsed.
    busy = scraped(metrics.registry).value("polar_engine_call_seconds_total", engine=shown)
    assert 0.4 <= busy <= 2 * (time.monotonic() - started)
    assert "secret" not in exposition(metrics.registry)[0].decode()


def test_stage_tasks_are_timed_and_counted_by_outcome() -> None:
    metrics = StageMetrics()
    with metrics.task("init", "node-a"):
        assert scraped(metrics.registry).value("polar_stage_tasks_in_progress", stage="init", node="node-a") == 1
    with pytest.raises(ValueError, match="boom"), metrics.task("init", "node-a"):
        raise ValueError("boom")

    scrape = scraped(metrics.registry)
    assert scrape.value("polar_stage_tasks_in_progress", stage="init") == 0
    assert scrape.value("polar_stage_tasks_total", stage="init", node="node-a", outcome="ok") == 1
    assert scrape.value("polar_stage_tasks_total", stage="init", node="node-a", outcome="error") == 1
    assert scrape.value("polar_stage_duration_seconds_count", stage="init", node="node-a") == 2


def test_api_requests_are_counted_by_endpoint() -> None:
    metrics = ApiMetrics()
    metrics.answered("batches.submit", "POST", 201, 0.02)
    metrics.answered("none", "GET", 404, 0.001)
    scrape = scraped(metrics.registry)
    assert scrape.value("polar_api_requests_total", endpoint="batches.submit", method="POST", status="201") == 1
    assert scrape.value("polar_api_request_duration_seconds_count", endpoint="none") == 1
