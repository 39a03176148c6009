"""The series each kind of process records: names and labels as docs/metrics.md lists them, values that follow
what happened, and an exposition ``prometheus_client``'s parser reads."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from polar.fleet.engines import EnginePool
from polar.observability import ApiMetrics, ProxyMetrics, StageMetrics, exposition
from polar.observability import metrics as metrics_module
from tests.processes import wait_until
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


HANG_GUARD_S = 60  # a hang guard, not a speed claim


class _HeldEngine(BaseHTTPRequestHandler):
    """Answers each POST once the test releases it, so a call can be watched while in flight; ``arrived`` counts
    the POSTs that reached it."""

    release = threading.Event()
    arrived = 0
    lock = threading.Lock()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        with self.lock:
            _HeldEngine.arrived += 1
        self.release.wait(HANG_GUARD_S)
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
    _HeldEngine.arrived = 0
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://user:secret@127.0.0.1:{server.server_address[1]}"
    finally:
        _HeldEngine.release.set()
        server.shutdown()
        server.server_close()


class _Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


def test_engine_inflight_gauge_follows_the_calls_an_engine_holds(
    held_engine: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = _Clock()  # the call seconds are read on it: exact, however slowly a loaded machine runs the calls
    monkeypatch.setattr(metrics_module, "time", clock)
    metrics = ProxyMetrics()
    pool = EnginePool([held_engine], timeout_s=HANG_GUARD_S, metrics=metrics)
    shown = held_engine.replace("user:secret@", "")  # the label never carries credentials

    def inflight() -> float:
        return scraped(metrics.registry).value("polar_engine_inflight_calls", engine=shown)

    assert scraped(metrics.registry).has("polar_engine_inflight_calls", engine=shown)  # at 0 from the start
    assert scraped(metrics.registry).value("polar_engine_call_seconds_total", engine=shown) == 0
    calls = [threading.Thread(target=pool.post, args=(uuid.uuid4(), "/v1/x", {}, "m")) for _ in range(2)]
    for call in calls:
        call.start()
    try:
        # Both calls reached the engine (their clocks started before they were sent) and are held there.
        wait_until(lambda: _HeldEngine.arrived == 2, HANG_GUARD_S, "both calls at the engine")
        assert inflight() == 2
        clock.now += 0.2  # both held for 0.2 s
    finally:
        _HeldEngine.release.set()
        for call in calls:
            call.join(HANG_GUARD_S)
        pool.close()
    assert inflight() == 0
    # Two calls held together: their seconds add up (occupancy = rate / max_num_seqs).
    busy = scraped(metrics.registry).value("polar_engine_call_seconds_total", engine=shown)
    assert busy == pytest.approx(0.4)
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
