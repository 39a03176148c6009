"""What produced a batch's results, recorded at submission in ``batches.provenance`` (docs/provenance.md):

    {"polar_version": "0.1.0", "python": "3.11.9",
     "config_digest": "sha256:…", "config": {non-secret configuration},
     "evaluators": [{"name": "test_on_output", "config_sha256": "…", "tasks": 3, "code": "polar 0.1.0"}],
     "engines": [{"url": "http://gpu1:8000", "models": ["Qwen/Qwen3-8B"], "version": "0.10.1", "error": null,
                  "checked_at": "…", "logprob_mode": "raw", "logprob_mode_error": null}],
     "recorded_at": "…"}

Secrets never enter it: configuration fields named like a secret (token, password, key, …) are left out, and URLs
keep only scheme, host, port and path (no user, password or query). Evaluator configs stay in the task specs
(``tasks.spec -> 'evaluator'``); provenance keeps a digest of each, to group batches that scored alike.

Engines are asked for ``/v1/models`` and ``/version`` with a short timeout, all at once, and the answers are kept
per process for ``ttl_s`` (an ``EngineProbe`` lives in ``Services``), so a submission never waits more than
``timeout_s`` + 0.5 s and an engine that is down is recorded as such (``error``) instead of failing the submission.

Each engine's logprob mode (raw or processed, ``polar.records.logprob_mode``) is probed once per engine and process,
in the background: a submission waits for it no longer than for the rest, records ``logprob_mode: null`` with why
while it runs, and a later one records the answer. A probe that could not tell is tried again after ``ttl_s``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
import platform
import re
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

import httpx

from polar.clock import iso, utcnow
from polar.codec.redaction import shown_url
from polar.config import Config
from polar.contract.task_request import TaskRequest
from polar.records import logprob_mode

# A configuration field whose name says it holds a credential is never recorded, not even as a digest input.
SECRET_NAME = re.compile(r"token|secret|password|passwd|credential|auth|key", re.IGNORECASE)
PROBE_TIMEOUT_S = 1.0
PROBE_TTL_S = 60.0
_BUILT_IN_CODE = "polar"
_PATHS = ("/v1/models", "/version")
LOGPROB_PROBE_TIMEOUT_S = 30.0


def polar_version() -> str:
    try:
        return importlib.metadata.version("polar")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _public(value: Any) -> Any:
    """``value`` as JSON with URLs redacted and secret-named mapping keys dropped."""
    if isinstance(value, str):
        return shown_url(value) if "://" in value else value
    if isinstance(value, Mapping):
        return {str(k): _public(v) for k, v in value.items() if not SECRET_NAME.search(str(k))}
    if isinstance(value, list | tuple):
        return [_public(v) for v in value]
    return value


def public_config(config: Config) -> dict[str, Any]:
    """Every configuration field except the secret-named ones, URLs redacted, in field order."""
    return {
        field.name: _public(getattr(config, field.name))
        for field in dataclasses.fields(config)
        if not SECRET_NAME.search(field.name)
    }


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def config_digest(config: Config) -> str:
    """``sha256:<hex>`` of ``public_config(config)`` as canonical JSON."""
    return f"sha256:{_digest(public_config(config))}"


def _evaluator_code(name: str) -> str | None:
    """Which installed code an evaluator name resolves to: Polar for the built-ins, else the distribution that
    provides its module (entry point or ``module:Class``), when one does."""
    # Imported here: the evaluators bring pydantic models, the runtimes and the Docker SDK, and the proxy and the
    # API's other routes reach this module through polar.services without ever asking about an evaluator.
    from polar.evaluators import ENTRY_POINT_GROUP, EVALUATORS

    if name in EVALUATORS:
        return f"{_BUILT_IN_CODE} {polar_version()}"
    points = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP, name=name)
    module = next(iter(points)).module if points else name.partition(":")[0]
    top = module.split(".")[0]
    distributions = importlib.metadata.packages_distributions().get(top) or []
    if not distributions:
        return None
    return f"{distributions[0]} {importlib.metadata.version(distributions[0])}"


def evaluator_summary(tasks: Sequence[TaskRequest]) -> list[dict[str, Any]]:
    """One entry per distinct evaluator (name + config) of the batch, with how many tasks use it."""
    seen: dict[tuple[str, str], dict[str, Any]] = {}
    for task in tasks:
        name, config = task.evaluator.name, dict(task.evaluator.config or {})
        key = (name, _digest(config))
        if key not in seen:
            seen[key] = {"name": name, "config_sha256": key[1], "tasks": 0, "code": _evaluator_code(name)}
        seen[key]["tasks"] += 1
    return list(seen.values())


class EngineProbe:
    """The engines' served models and versions, asked at most once per ``ttl_s`` per process."""

    def __init__(self, timeout_s: float = PROBE_TIMEOUT_S, ttl_s: float = PROBE_TTL_S) -> None:
        self.timeout_s = timeout_s
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        self._cached: dict[str, tuple[float, dict[str, Any]]] = {}
        # Per engine, its logprob-mode probe and when it may be asked again (never, once it told).
        self._modes: dict[str, tuple[Future[dict[str, Any]], float]] = {}
        self._mode_pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="logprob-mode")
        self._mode_client = httpx.Client(timeout=httpx.Timeout(LOGPROB_PROBE_TIMEOUT_S, connect=timeout_s))

    def engines(self, urls: Iterable[str]) -> list[dict[str, Any]]:
        """What each engine said (or why it said nothing), in ``urls`` order."""
        urls = list(urls)
        with self._lock:
            now = time.monotonic()
            stale = [url for url in dict.fromkeys(urls) if url not in self._cached or self._cached[url][0] <= now]
            modes = {url: self._mode_probe(url) for url in dict.fromkeys(urls)}
            if stale:
                for url, facts in zip(stale, self._ask(stale), strict=True):
                    self._cached[url] = (time.monotonic() + self.ttl_s, facts)
            wait(modes.values(), timeout=self.timeout_s + 0.5)
            return [{**self._cached[url][1], **_mode(modes[url])} for url in urls]

    def _mode_probe(self, url: str) -> Future[dict[str, Any]]:
        """The engine's logprob-mode probe: the one that told, one still running, or a new one."""
        known = self._modes.get(url)
        if known is not None and (not known[0].done() or known[1] > time.monotonic()):
            return known[0]
        from polar.contract.engine_addresses import parse_engine_url

        address = parse_engine_url(url).url
        future = self._mode_pool.submit(logprob_mode.probe, self._mode_client, address)
        self._modes[url] = (future, float("inf"))
        future.add_done_callback(lambda done: self._retry_later(url, done))
        return future

    def _retry_later(self, url: str, done: Future[dict[str, Any]]) -> None:
        if done.result()["logprob_mode"] is None:
            self._modes[url] = (done, time.monotonic() + self.ttl_s)

    def _ask(self, urls: Sequence[str]) -> list[dict[str, Any]]:
        """Every engine's answers, all asked at once; what has not answered by the deadline is recorded as such
        and left behind (its thread ends with the client closed under it)."""
        deadline = self.timeout_s + 0.5  # past httpx's own timeouts, which say more precisely what went wrong
        client = httpx.Client(timeout=httpx.Timeout(self.timeout_s))
        pool = ThreadPoolExecutor(max_workers=min(len(urls) * len(_PATHS), 16))
        try:
            asked = {
                (url, path): pool.submit(_get_json, client, _address(url, path)) for url in urls for path in _PATHS
            }
            wait(asked.values(), timeout=deadline)
            late = RuntimeError(f"no answer within {deadline:g} s")
            answers = {key: future.result() if future.done() else late for key, future in asked.items()}
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
            client.close()
        return [_facts(url, answers[(url, "/v1/models")], answers[(url, "/version")]) for url in urls]


def _mode(probe: Future[dict[str, Any]]) -> dict[str, Any]:
    if probe.done():
        return probe.result()
    return {"logprob_mode": None, "logprob_mode_error": "probe still running; a later batch records it"}


def _address(engine: str, path: str) -> str:
    """Where to ask ``engine`` (a ``POLAR_ENGINE_URLS`` entry) for ``path``: SGLang says its version in
    ``/get_server_info``."""
    from polar.contract.engine_addresses import parse_engine_url, version_path

    address = parse_engine_url(engine)
    return address.url + (version_path(address) if path == "/version" else path)


def _facts(url: str, models: Any, version: Any) -> dict[str, Any]:
    facts: dict[str, Any] = {"url": shown_url(url), "models": None, "version": None, "error": None}
    errors = []
    if isinstance(models, Exception):
        errors.append(f"/v1/models: {models}")
    else:
        data = models.get("data") if isinstance(models, dict) else None
        facts["models"] = [str(m.get("id")) for m in data if isinstance(m, dict)] if isinstance(data, list) else []
    if isinstance(version, Exception):
        errors.append(f"/version: {version}")
    elif isinstance(version, dict) and version.get("version") is not None:
        facts["version"] = str(version["version"])
    facts["error"] = "; ".join(errors) or None
    facts["checked_at"] = iso(utcnow())
    return facts


def _get_json(client: httpx.Client, url: str) -> Any:
    """The JSON ``url`` answers, or the exception that says why there is none (returned, to be recorded)."""
    try:
        response = client.get(url)
    except httpx.HTTPError as exc:  # the message names no URL: connection refused, timed out
        return RuntimeError(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
    if response.status_code != 200:
        return RuntimeError(f"answered {response.status_code}")
    try:
        return response.json()
    except ValueError:
        return RuntimeError("answered with something other than JSON")


def batch_provenance(config: Config, probe: EngineProbe, tasks: Sequence[TaskRequest]) -> dict[str, Any]:
    """The provenance a batch of ``tasks`` submitted now records."""
    return {
        "polar_version": polar_version(),
        "python": platform.python_version(),
        "config_digest": config_digest(config),
        "config": public_config(config),
        "evaluators": evaluator_summary(tasks),
        "engines": probe.engines(config.engine_urls),
        "recorded_at": iso(utcnow()),
    }
