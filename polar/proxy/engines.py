"""The inference engines behind the proxy (vLLM or the reference engine), reached over HTTP.

A session is pinned to one engine (hash of its id) so its growing prompt keeps hitting the same prefix cache.
An engine that refuses connections is marked unhealthy for ``cooldown_s`` and skipped (moved to the end of the
order) meanwhile; a connection failure happens before any byte reached the client, so the call simply moves
on to the next engine. Timeouts and engine 5xx are not retried: the engine may have done the work.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from polar.errors import EngineError, EngineTimeout
from polar.observability.metrics import ProxyMetrics
from polar.redaction import shown_url


@dataclass(frozen=True)
class EngineReply:
    url: str | None  # None for a call no engine answered
    status_code: int
    body: dict[str, Any]
    latency_ms: float

    @property
    def error_message(self) -> str:
        error = self.body.get("error")
        return str(error.get("message") if isinstance(error, dict) else error or f"engine answered {self.status_code}")


def _error_body(response: httpx.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        return {"error": {"message": response.text[:500] or f"engine answered {response.status_code}"}}
    error = body.get("error", body) if isinstance(body, dict) else body
    message = error.get("message") if isinstance(error, dict) else error
    return {"error": {"message": str(message or error)}}


class EnginePool:
    """The engines, with each request in flight shown on ``metrics`` (``polar_engine_inflight_calls``)."""

    def __init__(
        self,
        urls: Sequence[str],
        timeout_s: float,
        max_connections: int = 256,
        cooldown_s: float = 5.0,
        metrics: ProxyMetrics | None = None,
    ) -> None:
        if not urls:
            raise ValueError("at least one engine URL is needed")
        self.urls = tuple(urls)
        self.cooldown_s = cooldown_s
        self.metrics = metrics
        if metrics is not None:
            metrics.engines(tuple(shown_url(url) for url in self.urls))
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        self._client = httpx.Client(timeout=httpx.Timeout(timeout_s, connect=5.0), limits=limits)
        self._served: dict[str, str] = {}
        self._down_until: dict[str, float] = {}
        self._lock = threading.Lock()

    def order(self, session_id: uuid.UUID) -> list[str]:
        """Engines to try for this session: its pinned one first, engines recently down last."""
        start = int.from_bytes(hashlib.sha256(session_id.bytes).digest()[:8], "big") % len(self.urls)
        ring = [self.urls[(start + i) % len(self.urls)] for i in range(len(self.urls))]
        now = time.monotonic()
        return sorted(ring, key=lambda url: self._down_until.get(url, 0.0) > now)

    def _mark_down(self, url: str) -> None:
        with self._lock:
            self._down_until[url] = time.monotonic() + self.cooldown_s

    def served_model(self, url: str) -> str:
        """The model name an engine serves (its first ``/v1/models`` entry), asked once per engine."""
        if url not in self._served:
            response = self._client.get(url + "/v1/models", timeout=5.0)
            try:
                self._served[url] = response.json()["data"][0]["id"]
            except (ValueError, KeyError, IndexError, TypeError) as exc:
                raise EngineError(
                    f"engine {shown_url(url)} did not say which model it serves", status_code=502
                ) from exc
        return self._served[url]

    def post(self, session_id: uuid.UUID, path: str, body: dict[str, Any], model: str | None) -> EngineReply:
        """POST ``body`` to ``path`` on the session's engine, naming ``model`` (default: the model the engine
        serves). 4xx answers come back as replies; connection failures move on; everything else raises."""
        failures: list[str] = []
        for url in self.order(session_id):
            started = time.perf_counter()
            try:
                body["model"] = model or self.served_model(url)
                with self._in_flight(url):
                    response = self._client.post(url + path, json=body)
            except httpx.ConnectError as exc:
                self._mark_down(url)
                failures.append(f"{shown_url(url)}: {exc}")
                continue
            except httpx.TimeoutException as exc:
                raise EngineTimeout(f"engine {shown_url(url)} did not answer in time", status_code=504) from exc
            except httpx.HTTPError as exc:
                raise EngineError(
                    f"engine {shown_url(url)} failed: {type(exc).__name__}: {exc}", status_code=502
                ) from exc
            latency = (time.perf_counter() - started) * 1000
            if response.status_code >= 500:
                message = _error_body(response)["error"]["message"]
                raise EngineError(f"engine error ({response.status_code}): {message}", status_code=502)
            if response.status_code >= 400:
                return EngineReply(url, response.status_code, _error_body(response), latency)
            try:
                return EngineReply(url, response.status_code, response.json(), latency)
            except ValueError as exc:
                raise EngineError("engine answered with invalid JSON", status_code=502) from exc
        raise EngineError(f"no engine reachable: {'; '.join(failures)}", status_code=502)

    def _in_flight(self, url: str) -> contextlib.AbstractContextManager[None]:
        return self.metrics.engine_call(shown_url(url)) if self.metrics is not None else contextlib.nullcontext()

    def get(self, path: str) -> dict[str, Any]:
        for url in self.urls:
            try:
                response = self._client.get(url + path, timeout=5.0)
                if response.status_code == 200:
                    return response.json()  # type: ignore[no-any-return]
            except (httpx.HTTPError, ValueError):
                self._mark_down(url)
        raise EngineError(f"no engine answered GET {path}", status_code=502)

    def close(self) -> None:
        self._client.close()
