"""Pausing and resuming the engines themselves around a weight update, with the proxies' hold
(``polar.fleet.control``) in front of them.

    results = pause_engines(addresses, "keep", clear_cache=False)   # after the proxies stopped starting calls
    results = resume_engines(addresses, "step-42")                  # after the new policy version is recorded

Each kind's pause and resume is its backend's (``polar.fleet.backends``; facts from the engines' sources, recorded
in ``tests/contracts/``). Polar asks an engine's version first and refuses a mode its build would not honour (an
older vLLM ignores ``mode`` and aborts).

Each engine's outcome is reported (``ok``, ``error``); one engine failing does not stop the others, and the
proxies' hold stands either way.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

import httpx

from polar.codec.redaction import shown_url
from polar.contract.engine_addresses import EngineAddress, version_path
from polar.errors import ValidationError
from polar.fleet.backends import backend

EngineMode = Literal["keep", "wait", "abort"]
ENGINE_MODES: tuple[EngineMode, ...] = ("keep", "wait", "abort")
TIMEOUT_S = 600.0
_VERSION = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")


def parse_version(text: str | None) -> tuple[int, int, int] | None:
    """``0.16.0rc1.dev5+g…`` → (0, 16, 0); None when there is no version to read."""
    match = _VERSION.match(text or "")
    if match is None:
        return None
    return int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)


def engine_version(client: httpx.Client, address: EngineAddress) -> str | None:
    """The version an engine reports (``version_path``: vLLM ``/version``, SGLang ``/get_server_info``), or None."""
    try:
        response = client.get(address.url + version_path(address), timeout=5.0)
        return str(response.json().get("version")) if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError):
        return None


def unsupported(address: EngineAddress, version: str | None, mode: EngineMode) -> str | None:
    """Why this engine cannot be paused in ``mode`` (None: it can)."""
    return backend(address.kind).pause_refusal(parse_version(version), version, mode)


def _answer(response: httpx.Response) -> str | None:
    if response.status_code == 200:
        return None
    if response.status_code == 404:
        return f"{response.request.url.path} not found (vLLM serves it only with VLLM_SERVER_DEV_MODE=1)"
    return f"{response.request.url.path} answered {response.status_code}: {response.text[:300]}"


def _pause_one(client: httpx.Client, address: EngineAddress, mode: EngineMode, clear_cache: bool) -> dict[str, Any]:
    result: dict[str, Any] = {"url": shown_url(address.url), "kind": address.kind, "ok": False, "error": None}
    try:
        version = engine_version(client, address)
        result["version"] = version
        if (why := unsupported(address, version, mode)) is not None:
            result["error"] = why
            return result
        result["error"] = _answer(backend(address.kind).pause(client, address.url, mode, clear_cache))
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
        result["error"] = _answer(backend(address.kind).resume(client, address.url))
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
