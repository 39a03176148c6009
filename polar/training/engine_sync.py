"""Pausing and resuming the engines themselves around a weight update, with the proxies' hold
(``polar.fleet.control``) in front of them.

    results = pause_engines(addresses, "keep", clear_cache=False)   # after the proxies stopped starting calls
    results = resume_engines(addresses, "step-42")                  # after the new policy version is recorded

Per kind (facts from the engines' sources, recorded in ``tests/contracts/``):

- vLLM (dev mode, ``VLLM_SERVER_DEV_MODE=1``): ``POST /pause?mode=keep|wait|abort&clear_cache=…`` (vLLM ≥ 0.12,
  PR #28037; ``mode`` from PR #32351, merged 2026-02-07, first released in 0.16), ``POST /resume``, and
  ``POST /update_weight_version {"new_version"}`` where the build has it. An older vLLM ignores ``mode`` and
  aborts, so Polar asks ``/version`` first and refuses to send ``keep`` below ``KEEP_SINCE["vllm"]``.
- SGLang: ``POST /pause_generation {"mode": "in_place"|"abort"}`` (``keep`` is ``in_place``; SGLang ≤ 0.5.5 took
  no mode), ``POST /continue_generation``, ``POST /update_weight_version {"new_version"}``. SGLang has no
  ``wait``: Polar polls its running + waiting requests (``/metrics``) down to zero, then pauses ``in_place``.

Each engine's outcome is reported (``ok``, ``error``); one engine failing does not stop the others, and the
proxies' hold stands either way.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

import httpx

from polar.codec.redaction import shown_url
from polar.contract.engine_addresses import EngineAddress
from polar.errors import ValidationError
from polar.fleet.engines import reported_load

EngineMode = Literal["keep", "wait", "abort"]
ENGINE_MODES: tuple[EngineMode, ...] = ("keep", "wait", "abort")
PAUSE_SINCE = {"vllm": (0, 12, 0)}
KEEP_SINCE = {"vllm": (0, 16, 0), "sglang": (0, 5, 6)}
TIMEOUT_S = 600.0
_SGLANG_MODES = {"keep": "in_place", "abort": "abort"}
_VERSION = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")


def parse_version(text: str | None) -> tuple[int, int, int] | None:
    """``0.16.0rc1.dev5+g…`` → (0, 16, 0); None when there is no version to read."""
    match = _VERSION.match(text or "")
    if match is None:
        return None
    return int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)


def engine_version(client: httpx.Client, address: EngineAddress) -> str | None:
    """The version an engine reports (vLLM ``/version``, SGLang ``/get_server_info``), or None."""
    path = "/get_server_info" if address.kind == "sglang" else "/version"
    try:
        response = client.get(address.url + path, timeout=5.0)
        return str(response.json().get("version")) if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError):
        return None


def unsupported(address: EngineAddress, version: str | None, mode: EngineMode) -> str | None:
    """Why this engine cannot be paused in ``mode`` (None: it can)."""
    parsed = parse_version(version)
    if parsed is None:
        return None  # a build that does not say: try, and report what it answers
    if address.kind == "vllm" and parsed < PAUSE_SINCE["vllm"]:
        return f"vLLM {version} has no /pause (needs ≥ 0.12 with VLLM_SERVER_DEV_MODE=1)"
    since = KEEP_SINCE.get(address.kind)
    if mode == "keep" and since is not None and parsed < since:
        label = "vLLM" if address.kind == "vllm" else "SGLang"
        return f"{label} {version} cannot keep in-flight requests across a pause (needs ≥ {'.'.join(map(str, since))})"
    return None


def _answer(response: httpx.Response) -> str | None:
    if response.status_code == 200:
        return None
    if response.status_code == 404:
        return f"{response.request.url.path} not found (vLLM serves it only with VLLM_SERVER_DEV_MODE=1)"
    return f"{response.request.url.path} answered {response.status_code}: {response.text[:300]}"


def _running(client: httpx.Client, address: EngineAddress) -> float:
    response = client.get(address.url + "/metrics", timeout=5.0)
    return reported_load(response.text) or 0.0


def _pause_one(client: httpx.Client, address: EngineAddress, mode: EngineMode, clear_cache: bool) -> dict[str, Any]:
    result: dict[str, Any] = {"url": shown_url(address.url), "kind": address.kind, "ok": False, "error": None}
    try:
        version = engine_version(client, address)
        result["version"] = version
        if (why := unsupported(address, version, mode)) is not None:
            result["error"] = why
            return result
        if address.kind == "vllm":
            query = {"mode": mode, "clear_cache": "true" if clear_cache else "false"}
            result["error"] = _answer(client.post(address.url + "/pause", params=query))
        else:
            if mode == "wait":
                deadline = time.monotonic() + TIMEOUT_S
                while _running(client, address) > 0 and time.monotonic() < deadline:
                    time.sleep(0.05)
            sglang_mode = _SGLANG_MODES.get(mode, "in_place")
            result["error"] = _answer(client.post(address.url + "/pause_generation", json={"mode": sglang_mode}))
    except httpx.HTTPError as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
    result["ok"] = result["error"] is None
    return result


def _resume_one(client: httpx.Client, address: EngineAddress, policy_version: str | None) -> dict[str, Any]:
    result: dict[str, Any] = {"url": shown_url(address.url), "kind": address.kind, "ok": False, "error": None}
    try:
        if policy_version is not None:  # best effort: not every build has it, and the proxy records versions
            update = client.post(address.url + "/update_weight_version", json={"new_version": policy_version})
            result["weight_version_set"] = update.status_code == 200
        path = "/continue_generation" if address.kind == "sglang" else "/resume"
        response = (
            client.post(address.url + path, json={}) if address.kind == "sglang" else client.post(address.url + path)
        )
        result["error"] = _answer(response)
    except httpx.HTTPError as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
    result["ok"] = result["error"] is None
    return result


def check_mode(mode: str | None) -> EngineMode | None:
    if mode is not None and mode not in ENGINE_MODES:
        raise ValidationError(f"engine_mode: must be one of {', '.join(ENGINE_MODES)}", field="engine_mode")
    return mode  # type: ignore[return-value]


def pause_engines(addresses: Sequence[EngineAddress], mode: EngineMode, clear_cache: bool) -> list[dict[str, Any]]:
    """Pause every engine at once; returns once each has answered (``wait``: once each has drained)."""
    with httpx.Client(timeout=TIMEOUT_S) as client, ThreadPoolExecutor(max_workers=16) as pool:
        return list(pool.map(lambda a: _pause_one(client, a, mode, clear_cache), addresses))


def resume_engines(addresses: Sequence[EngineAddress], policy_version: str | None) -> list[dict[str, Any]]:
    """Tell every engine its new weight version (where it has the route) and resume it."""
    with httpx.Client(timeout=30.0) as client, ThreadPoolExecutor(max_workers=16) as pool:
        return list(pool.map(lambda a: _resume_one(client, a, policy_version), addresses))
