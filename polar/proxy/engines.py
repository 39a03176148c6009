"""The inference engines behind the proxy (vLLM or the reference engine), reached over HTTP.

A session is pinned to one engine (hash of its id) so its growing prompt keeps hitting the same prefix cache;
a connection failure, which happens before any byte reached the client, moves the call to the next engine.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from polar.errors import EngineError, EngineTimeout


@dataclass(frozen=True)
class EngineReply:
    url: str
    status_code: int
    body: dict[str, Any]
    latency_ms: float

    @property
    def error_message(self) -> str:
        error = self.body.get("error")
        return str(error.get("message") if isinstance(error, dict) else error or f"engine answered {self.status_code}")


def _error_message(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:500] or f"engine answered {response.status_code}"
    error = body.get("error", body) if isinstance(body, dict) else body
    if isinstance(error, dict):
        return str(error.get("message") or error)
    return str(error)


class EnginePool:
    def __init__(self, urls: Sequence[str], timeout_s: float, max_connections: int = 256) -> None:
        if not urls:
            raise ValueError("at least one engine URL is needed")
        self.urls = tuple(urls)
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        self._client = httpx.Client(timeout=httpx.Timeout(timeout_s, connect=5.0), limits=limits)
        self._served: dict[str, str] = {}

    def served_model(self, url: str) -> str:
        """The model name an engine serves (its first ``/v1/models`` entry), asked once per engine."""
        if url not in self._served:
            try:
                response = self._client.get(url + "/v1/models", timeout=5.0)
                self._served[url] = response.json()["data"][0]["id"]
            except httpx.ConnectError:
                raise
            except (httpx.HTTPError, ValueError, KeyError, IndexError) as exc:
                raise EngineError(f"engine {url} did not say which model it serves: {exc}", status_code=502) from exc
        return self._served[url]

    def order(self, session_id: uuid.UUID) -> list[str]:
        """Engines to try for this session: its pinned one first."""
        start = int.from_bytes(hashlib.sha256(session_id.bytes).digest()[:8], "big") % len(self.urls)
        return [self.urls[(start + i) % len(self.urls)] for i in range(len(self.urls))]

    def post(self, session_id: uuid.UUID, path: str, body: dict[str, Any], model: str | None) -> EngineReply:
        """POST ``body`` to ``path`` on the session's engine, naming ``model`` (default: the model the engine
        serves); 4xx answers come back, failures raise."""
        last: Exception | None = None
        for url in self.order(session_id):
            started = time.perf_counter()
            try:
                body["model"] = model or self.served_model(url)
                response = self._client.post(url + path, json=body)
            except httpx.ConnectError as exc:
                last = exc
                continue
            except httpx.TimeoutException as exc:
                raise EngineTimeout(f"engine {url} did not answer in time", status_code=504) from exc
            except httpx.HTTPError as exc:
                raise EngineError(f"engine {url} failed: {type(exc).__name__}: {exc}", status_code=502) from exc
            latency = (time.perf_counter() - started) * 1000
            if response.status_code >= 500:
                raise EngineError(f"engine error: {_error_message(response)}", status_code=502)
            if response.status_code >= 400:
                return EngineReply(url, response.status_code, {"error": {"message": _error_message(response)}}, latency)
            try:
                return EngineReply(url, response.status_code, response.json(), latency)
            except ValueError as exc:
                raise EngineError("engine answered with invalid JSON", status_code=502) from exc
        raise EngineError(f"no engine reachable ({last})", status_code=502)

    def get(self, path: str) -> dict[str, Any]:
        for url in self.urls:
            try:
                response = self._client.get(url + path, timeout=5.0)
                if response.status_code == 200:
                    return response.json()  # type: ignore[no-any-return]
            except (httpx.HTTPError, ValueError):
                continue
        raise EngineError(f"no engine answered GET {path}", status_code=502)

    def close(self) -> None:
        self._client.close()
