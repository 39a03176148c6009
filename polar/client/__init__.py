"""A small Python client for the rollout API: submit a batch, wait for it, read sessions and trajectories.

client = PolarClient("http://127.0.0.1:8200", token=...)
batch = client.submit({"tasks": [...]})
client.wait(batch["batch_id"])
for session in client.sessions(batch["batch_id"]): ...
client.download(batch["batch_id"], "rl", "parquet", None, Path("rl.parquet"))
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

from polar.config import load_config
from polar.errors import PolarError

# A submission is retried on what NeMo RL also treats as infrastructure (no answer, 5xx, 408, 429), always with
# its Idempotency-Key, so a retry after a lost answer returns the batch the first try stored.
SUBMIT_ATTEMPTS = 4
SUBMIT_BACKOFF_S = 1.0
_RETRIED_STATUSES = frozenset({408, 429})


class APIError(PolarError):
    """The rollout API answered with an error."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


def _error_message(response: httpx.Response) -> str:
    try:
        return str(response.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return response.text[:500]


def new_idempotency_key() -> str:
    return f"polar-{uuid.uuid4()}"


class PolarClient:
    def __init__(self, base_url: str, token: str | None = None, timeout_s: float = 30.0) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout_s)

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        # A read is retried once when the connection fails: a kept-alive connection the server closed just then
        # (gunicorn drops idle ones after 2 s, the interval a watcher polls at) is no reason to fail.
        attempts = 2 if method == "GET" else 1
        for attempt in range(attempts):
            try:
                response = self._http.request(method, path, **kwargs)
                break
            except (httpx.NetworkError, httpx.RemoteProtocolError) as exc:  # not timeouts: those would double
                if attempt + 1 < attempts:
                    continue
                raise APIError(0, f"cannot reach {self._http.base_url}: {exc}") from exc
            except httpx.HTTPError as exc:
                raise APIError(0, f"cannot reach {self._http.base_url}: {exc}") from exc
        if response.status_code >= 400:
            raise APIError(response.status_code, _error_message(response))
        return response.json()

    def submit(self, batch: dict[str, Any], idempotency_key: str | None = None) -> dict[str, Any]:
        """Submit ``batch``: ``{"batch_id", "num_sessions"}``. Always with an ``Idempotency-Key`` (a fresh one when
        none is given), so the retries here, and a caller's own with the same key, store the batch once."""
        headers = {"Idempotency-Key": idempotency_key or new_idempotency_key()}
        for attempt in range(1, SUBMIT_ATTEMPTS + 1):
            try:
                return self._call("POST", "/v1/batches", json=batch, headers=headers)  # type: ignore[no-any-return]
            except APIError as exc:
                infrastructure = exc.status == 0 or exc.status >= 500 or exc.status in _RETRIED_STATUSES
                if not infrastructure or attempt == SUBMIT_ATTEMPTS:
                    raise
                time.sleep(SUBMIT_BACKOFF_S * 2 ** (attempt - 1))
        raise AssertionError("unreachable")  # the loop returns or raises

    def batch(self, batch_id: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/batches/{batch_id}")  # type: ignore[no-any-return]

    def sessions(self, batch_id: str, page_size: int = 500) -> Iterator[dict[str, Any]]:
        params: dict[str, Any] = {"limit": page_size}
        while True:
            page = self._call("GET", f"/v1/batches/{batch_id}/sessions", params=params)
            yield from page["items"]
            if page["next_after"] is None:
                return
            params["after"] = page["next_after"]

    def cancel(self, batch_id: str) -> dict[str, Any]:
        """Cancel a batch: unstarted sessions end at once, started ones go through postrun."""
        return self._call("POST", f"/v1/batches/{batch_id}/cancel")  # type: ignore[no-any-return]

    def session(self, session_id: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/sessions/{session_id}")  # type: ignore[no-any-return]

    def calls(self, session_id: str, page_size: int = 50) -> list[dict[str, Any]]:
        """Every captured call of the session, whole, following ``/calls``' pages."""
        calls: list[dict[str, Any]] = []
        after: int | None = 0
        while after is not None:
            page = self._call("GET", f"/v1/sessions/{session_id}/calls", params={"limit": page_size, "after": after})
            calls += page["items"]
            after = page["next_after"]
        return calls

    def events(self, session_id: str) -> dict[str, Any]:
        """The session's state changes, each with the time spent in the state it entered:
        ``{"items": [{"at", "from_state", "to_state", "node", "worker", "detail", "duration_s"}], "seconds_in",
        "total_s"}``."""
        return self._call("GET", f"/v1/sessions/{session_id}/events")  # type: ignore[no-any-return]

    def trajectories(self, session_id: str) -> list[dict[str, Any]]:
        return self._call("GET", f"/v1/sessions/{session_id}/trajectories")["items"]  # type: ignore[no-any-return]

    def media(self, sha256: str) -> tuple[bytes, str]:
        """An image a trajectory's ``media`` names: its bytes and media type (``GET /v1/media/{sha256}``)."""
        try:
            response = self._http.get(f"/v1/media/{sha256}")
        except httpx.HTTPError as exc:
            raise APIError(0, f"cannot reach {self._http.base_url}: {exc}") from exc
        if response.status_code >= 400:
            raise APIError(response.status_code, _error_message(response))
        return response.content, response.headers.get("content-type", "application/octet-stream")

    def download(
        self, batch_id: str, kind: str, fmt: str, min_reward: float | None, path: Path
    ) -> dict[str, float | int]:
        """Stream ``GET /v1/batches/<id>/export`` into ``path``; returns the export's counts from its headers."""
        params: dict[str, Any] = {"kind": kind, "format": fmt}
        if min_reward is not None:
            params["min_reward"] = min_reward
        try:
            with self._http.stream("GET", f"/v1/batches/{batch_id}/export", params=params, timeout=None) as response:
                if response.status_code >= 400:
                    response.read()
                    raise APIError(response.status_code, _error_message(response))
                with path.open("wb") as out:
                    for chunk in response.iter_bytes():
                        out.write(chunk)
                headers = response.headers
        except httpx.HTTPError as exc:
            raise APIError(0, f"cannot download from {self._http.base_url}: {exc}") from exc
        return {
            "sessions": int(headers.get("X-Polar-Sessions", 0)),
            "accepted": int(headers.get("X-Polar-Accepted", 0)),
            "acceptance_rate": float(headers.get("X-Polar-Acceptance-Rate", 0.0)),
            "rows": int(headers.get("X-Polar-Rows", 0)),
            "tokens": int(headers.get("X-Polar-Tokens", 0)),
        }

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

    def feed(
        self, batch_id: str | None = None, after: int = 0, wait_s: float = 0, limit: int = 100, groups: bool = False,
        informative: bool = False,
    ) -> dict[str, Any]:  # fmt: skip
        """One page of the trainers' feed: ``{"items": [trajectory…], "next_cursor": n}`` (with ``informative``, whole
        groups whose rewards vary, and ``skipped_uninformative``). A 429 (the API already holds as many long-polls as
        it may) is waited out within ``wait_s``, then the page is read without waiting."""
        params: dict[str, Any] = {"after": after, "wait": wait_s, "limit": limit, "groups": str(groups).lower()}
        if informative:
            params["informative"] = "true"
        if batch_id:
            params["batch_id"] = batch_id
        deadline = time.monotonic() + wait_s
        while True:
            try:
                return self._call("GET", "/v1/trajectories", params=params, timeout=wait_s + 30)  # type: ignore[no-any-return]
            except APIError as exc:
                if exc.status != 429:
                    raise
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                params["wait"] = 0  # never refused: a read without waiting takes no slot
            else:
                time.sleep(min(1.0, remaining))
                params["wait"] = max(0.0, deadline - time.monotonic())

    def iter_groups(
        self, batch_id: str, wait_s: float = 30, informative: bool = False, skipped: list[int] | None = None
    ) -> Iterator[list[dict[str, Any]]]:
        """Yield each group (all samples of a task) of a batch as soon as it has finished, until the batch has; with
        ``informative``, only the groups whose rewards vary, each page's count of the others appended to
        ``skipped``."""
        cursor = 0
        while True:
            # Read before the page: once the batch has finished, every group is committed, so the pages need no
            # long-poll and the first page that moves the cursor no further is the end (no wait_s spent after the
            # last group). A page can move it and hold no item: its groups were all cancelled or out of attempts.
            finished = self.batch(batch_id)["status"] == "finished"
            page = self.feed(batch_id, after=cursor, wait_s=0 if finished else wait_s, groups=True,
                             informative=informative)  # fmt: skip
            if skipped is not None:
                skipped.append(int(page.get("skipped_uninformative", 0)))
            groups: dict[str, list[dict[str, Any]]] = {}
            for item in page["items"]:
                groups.setdefault(item["group_id"], []).append(item)
            yield from groups.values()
            if finished and page["next_cursor"] == cursor:
                return
            cursor = page["next_cursor"]

    def pause(self, policy_version: str | None = None, mode: str = "reject") -> dict[str, Any]:
        """Hold new model calls (429 or wait); returns once every proxy has seen it."""
        body = {"mode": mode, **({"policy_version": policy_version} if policy_version is not None else {})}
        return self._call("POST", "/v1/engine/pause", json=body)  # type: ignore[no-any-return]

    def resume(self, policy_version: str | None = None) -> dict[str, Any]:
        body = {"policy_version": policy_version} if policy_version is not None else {}
        return self._call("POST", "/v1/engine/resume", json=body)  # type: ignore[no-any-return]

    def close(self) -> None:
        self._http.close()


def configured_client(api: str | None = None, token: str | None = None) -> PolarClient:
    """A client of ``api`` (default POLAR_API_URL) sending ``token``, else POLAR_API_TOKEN, else the read-only
    POLAR_API_READ_TOKEN (enough for status, logs and export on a trainer's machine)."""
    config = load_config()
    return PolarClient(api or config.api_url, token or config.api_token or config.api_read_token)
