"""The series Polar's processes record as they work (``docs/metrics.md`` lists every one): the proxy's calls, the
stage tasks of the workers, the API's own requests. One class per kind of process; each owns its metric objects
and a registry, and knows nothing of Flask or Celery (``web/`` and ``workers/`` call it):

    metrics = ProxyMetrics()
    with metrics.engine_call("http://engine:8000"):
        ...                                   # polar_engine_inflight_calls{engine=...} is 1 meanwhile
    metrics.answered("openai_chat", "generate", 200)

Names follow Prometheus' conventions: a ``polar_`` prefix, counters ending in ``_total``, seconds as the unit.
Gauges that count things in flight are summed over a group's live processes (``multiprocess_mode="livesum"``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# Model calls take milliseconds to minutes; capture takes milliseconds.
CALL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
# A stage task takes from milliseconds (ready) to the harness's whole budget (run).
STAGE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0)
# Why the proxy refused a model call without sending it to the engine.
PAUSED, MAX_CONCURRENT_CALLS, MAX_CALLS = "paused", "max_concurrent_calls", "max_calls"
MAX_COUNT_TOKENS = "max_count_tokens"


class ProxyMetrics:
    """What the proxy sees of each call: counts by protocol and status, where the time went, tokens, refusals,
    and the calls each engine holds right now (its busy-ness as the proxy sees it)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "polar_proxy_requests_total",
            "Requests the proxy answered, by client protocol, operation and status.",
            ["protocol", "operation", "status"],
            registry=r,
        )
        self.duration = Histogram(
            "polar_proxy_request_duration_seconds",
            "Model calls answered by the engine, by phase: engine (the engine's answer), capture (recording the "
            "call), proxy (the proxy's own work), total (all three).",
            ["protocol", "phase"],
            buckets=CALL_BUCKETS,
            registry=r,
        )
        self.prompt_tokens = Counter(
            "polar_proxy_prompt_tokens_total",
            "Prompt tokens of answered model calls (tokens in).",
            ["protocol"],
            registry=r,
        )
        self.completion_tokens = Counter(
            "polar_proxy_completion_tokens_total",
            "Sampled tokens of answered model calls (tokens out).",
            ["protocol"],
            registry=r,
        )
        self.rejected = Counter(
            "polar_proxy_rejected_calls_total",
            "Model calls refused with 429 and not sent to the engine: paused, max_concurrent_calls, max_calls or "
            "max_count_tokens.",
            ["protocol", "reason"],
            registry=r,
        )
        self.engine_inflight = Gauge(
            "polar_engine_inflight_calls",
            "Requests the proxy has sent to each engine and not yet had answered.",
            ["engine"],
            registry=r,
            multiprocess_mode="livesum",
        )
        self.engine_call_seconds = Counter(
            "polar_engine_call_seconds_total",
            "Seconds of requests in flight to each engine, summed over requests: its rate is the average number the "
            "engine was working on for the proxy, and divided by the engine's max_num_seqs, how busy the proxy kept "
            "it (one proxy; sum over proxies).",
            ["engine"],
            registry=r,
        )
        # Each labelled series, looked up once: ``labels()`` takes a lock and checks its values on every call, about
        # half of what a call's metrics cost here. Bounded by the labels' own values (protocols, phases, engines).
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}

    def _child(self, metric: Counter | Gauge | Histogram, *values: str) -> Any:
        key = (id(metric), values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*values)
        return child

    def answered(self, protocol: str, operation: str, status: int) -> None:
        self._child(self.requests, protocol, operation, str(status)).inc()

    def timed(self, protocol: str, engine_s: float, capture_s: float, total_s: float) -> None:
        """One call's phases; ``proxy`` is what is left of ``total_s`` after the engine and capture."""
        phases = {
            "engine": engine_s,
            "capture": capture_s,
            "proxy": max(0.0, total_s - engine_s - capture_s),
            "total": total_s,
        }
        for phase, seconds in phases.items():
            self._child(self.duration, protocol, phase).observe(seconds)

    def tokens(self, protocol: str, prompt: int, completion: int) -> None:
        self._child(self.prompt_tokens, protocol).inc(prompt)
        self._child(self.completion_tokens, protocol).inc(completion)

    def refused(self, protocol: str, reason: str) -> None:
        self._child(self.rejected, protocol, reason).inc()

    def engines(self, urls: tuple[str, ...]) -> None:
        """Show every engine's in-flight gauge and busy seconds from the start, at 0."""
        for url in urls:
            self.engine_inflight.labels(url).inc(0)
            self.engine_call_seconds.labels(url).inc(0)

    @contextmanager
    def engine_call(self, engine: str) -> Iterator[None]:
        gauge = self._child(self.engine_inflight, engine)
        gauge.inc()
        started = time.monotonic()
        try:
            yield
        finally:
            gauge.dec()
            self._child(self.engine_call_seconds, engine).inc(time.monotonic() - started)


class StageMetrics:
    """Stage tasks as a worker runs them: how long, how they ended (``ok``: returned, ``error``: raised), how many
    run now; labelled with the stage and the worker's node (``POLAR_NODE``)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        r = self.registry
        self.duration = Histogram(
            "polar_stage_duration_seconds",
            "Stage tasks' durations, by stage and node.",
            ["stage", "node"],
            buckets=STAGE_BUCKETS,
            registry=r,
        )
        self.tasks = Counter(
            "polar_stage_tasks_total",
            "Stage tasks finished, by stage, node and outcome (ok: returned, error: raised).",
            ["stage", "node", "outcome"],
            registry=r,
        )
        self.in_progress = Gauge(
            "polar_stage_tasks_in_progress",
            "Stage tasks running now, by stage and node.",
            ["stage", "node"],
            registry=r,
            multiprocess_mode="livesum",
        )

    @contextmanager
    def task(self, stage: str, node: str) -> Iterator[None]:
        """Time the ``with`` block as one task of ``stage`` on ``node``; an exception counts as ``error`` and
        propagates."""
        running = self.in_progress.labels(stage, node)
        running.inc()
        started = time.perf_counter()
        outcome = "error"
        try:
            yield
            outcome = "ok"
        finally:
            running.dec()
            self.duration.labels(stage, node).observe(time.perf_counter() - started)
            self.tasks.labels(stage, node, outcome).inc()


class ApiMetrics:
    """The API's own requests, by route (the Flask endpoint name, so the label set stays small)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "polar_api_requests_total",
            "API requests answered, by endpoint, method and status.",
            ["endpoint", "method", "status"],
            registry=r,
        )
        self.duration = Histogram(
            "polar_api_request_duration_seconds",
            "API requests' durations (feed long-polls included), by endpoint.",
            ["endpoint"],
            buckets=CALL_BUCKETS,
            registry=r,
        )

    def answered(self, endpoint: str, method: str, status: int, seconds: float) -> None:
        self.requests.labels(endpoint, method, str(status)).inc()
        self.duration.labels(endpoint).observe(seconds)
