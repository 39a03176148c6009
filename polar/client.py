"""A small Python client for the rollout API: submit a batch, wait for it, read sessions and trajectories.

client = PolarClient("http://127.0.0.1:8200", token=...)
batch = client.submit({"tasks": [...]})
client.wait(batch["batch_id"])
for session in client.sessions(batch["batch_id"]): ...
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx

from polar.errors import PolarError


class APIError(PolarError):
    """The rollout API answered with an error."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


class PolarClient:
    def __init__(self, base_url: str, token: str | None = None, timeout_s: float = 30.0) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout_s)

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise APIError(0, f"cannot reach {self._http.base_url}: {exc}") from exc
        if response.status_code >= 400:
            try:
                message = response.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = response.text[:500]
            raise APIError(response.status_code, message)
        return response.json()

    def submit(self, batch: dict[str, Any], idempotency_key: str | None = None) -> dict[str, Any]:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        return self._call("POST", "/v1/batches", json=batch, headers=headers)  # type: ignore[no-any-return]

    def batch(self, batch_id: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/batches/{batch_id}")  # type: ignore[no-any-return]

    def sessions(self, batch_id: str, page_size: int = 500) -> Iterator[dict[str, Any]]:
        offset: int | None = 0
        while offset is not None:
            page = self._call("GET", f"/v1/batches/{batch_id}/sessions", params={"limit": page_size, "offset": offset})
            yield from page["items"]
            offset = page["next_offset"]

    def session(self, session_id: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/sessions/{session_id}")  # type: ignore[no-any-return]

    def calls(self, session_id: str) -> list[dict[str, Any]]:
        return self._call("GET", f"/v1/sessions/{session_id}/calls")["items"]  # type: ignore[no-any-return]

    def trajectories(self, session_id: str) -> list[dict[str, Any]]:
        return self._call("GET", f"/v1/sessions/{session_id}/trajectories")["items"]  # type: ignore[no-any-return]

    def wait(
        self,
        batch_id: str,
        timeout_s: float | None = None,
        poll_s: float = 0.5,
        on_progress: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """Poll until every session of the batch is terminal; returns the final batch status."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            status = self.batch(batch_id)
            if on_progress:
                on_progress(status)
            if status["status"] == "finished":
                return status
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"batch {batch_id} not finished after {timeout_s}s: {status['counts']}")
            time.sleep(poll_s)

    def close(self) -> None:
        self._http.close()
