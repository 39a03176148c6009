"""Each engine kind's backend module: the same names in each, and the weight sync's hold as that engine's API
spells it (what goes on the wire, checked on a scripted server; that the engine takes it, on the reference engine
serving each API)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from polar.contract.engine_addresses import KINDS, EngineAddress, engine_label, parse_engine_url, version_path
from polar.fleet.backends import BACKENDS
from polar.training.engine_sync import pause_engines, resume_engines, unsupported
from tests.polar.conftest import RunningEngine
from tests.scripted_http import ScriptedServer

# The interface polar/fleet/backends/base.py names; a module missing one is a kind the proxy cannot use.
NAMES = ("KIND", "LABEL", "INFO_PATHS", "TOKEN_IN", "pause_refusal", "pause", "resume", "planned", "ask",
         "count_tokens")  # fmt: skip


def _json(body: dict[str, Any]) -> bytes:
    data = json.dumps(body).encode()
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(data), data)


def _engine(version: str) -> ScriptedServer:
    """An engine that says ``version``, has nothing running, and takes every pause and resume."""

    def script(head: bytes, body: bytes) -> tuple[bytes, bool]:
        path = head.split(b" ")[1]
        if path in (b"/version", b"/get_server_info"):
            return _json({"version": version}), False
        if path == b"/metrics":
            text = b"sglang:num_running_reqs 0.0\nsglang:num_queue_reqs 0.0\n"
            return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(text), text), False
        return _json({}), False

    return ScriptedServer(script)


def _sent(server: ScriptedServer) -> list[tuple[str, str]]:
    """Each request's request line and body, in order."""
    return [(raw.split(b"\r\n", 1)[0].decode(), raw.split(b"\r\n\r\n", 1)[1].decode()) for raw in server.requests]


def test_every_kind_has_a_backend_with_every_name() -> None:
    assert sorted(BACKENDS) == sorted(KINDS)
    for kind, module in BACKENDS.items():
        assert kind == module.KIND
        assert [name for name in NAMES if not hasattr(module, name)] == []


def test_an_address_is_written_and_asked_its_version_as_its_kind() -> None:
    assert engine_label(parse_engine_url("http://h:1")) == "http://h:1"
    assert engine_label(parse_engine_url("sglang+http://h:1")) == "sglang+http://h:1"
    assert version_path(EngineAddress("http://h:1", "vllm")) == "/version"
    assert version_path(EngineAddress("http://h:1", "sglang")) == "/get_server_info"


@pytest.mark.parametrize(
    ("kind", "version", "mode", "refused"),
    [
        ("vllm", "0.11.2", "abort", "has no /pause"),
        ("vllm", "0.15.1", "keep", "cannot keep"),
        ("vllm", "0.16.0rc1.dev5+g1", "keep", None),
        ("vllm", None, "keep", None),  # a build that does not say is tried
        ("sglang", "0.5.5", "keep", "cannot keep"),
        ("sglang", "0.5.5", "abort", None),
        ("sglang", "0.5.6", "keep", None),
    ],
)
def test_a_mode_a_build_would_not_honour_is_refused(
    kind: str, version: str | None, mode: Any, refused: str | None
) -> None:
    why = unsupported(EngineAddress("http://h:1", kind), version, mode)  # type: ignore[arg-type]
    assert (why is None) if refused is None else (refused in str(why))


def test_vllm_is_paused_and_resumed_through_its_dev_mode_routes() -> None:
    engine = _engine("0.16.0")
    url = f"http://127.0.0.1:{engine.port}"
    assert [r["ok"] for r in pause_engines([EngineAddress(url, "vllm")], "keep", clear_cache=True)] == [True]
    assert [r["ok"] for r in resume_engines([EngineAddress(url, "vllm")], "v2")] == [True]
    lines = [line for line, _ in _sent(engine)]
    assert lines == [
        "GET /version HTTP/1.1",
        "POST /pause?mode=keep&clear_cache=true HTTP/1.1",
        "POST /update_weight_version HTTP/1.1",
        "POST /resume HTTP/1.1",
    ]


def test_sglang_drains_before_a_wait_pause_and_keeps_in_place() -> None:
    engine = _engine("0.5.6")
    url = f"http://127.0.0.1:{engine.port}"
    assert [r["ok"] for r in pause_engines([EngineAddress(url, "sglang")], "wait", clear_cache=False)] == [True]
    assert [r["ok"] for r in pause_engines([EngineAddress(url, "sglang")], "keep", clear_cache=False)] == [True]
    assert [r["ok"] for r in resume_engines([EngineAddress(url, "sglang")], None)] == [True]
    assert _sent(engine) == [
        ("GET /get_server_info HTTP/1.1", ""),
        ("GET /metrics HTTP/1.1", ""),  # nothing running: paused at once
        ("POST /pause_generation HTTP/1.1", '{"mode":"in_place"}'),
        ("GET /get_server_info HTTP/1.1", ""),
        ("POST /pause_generation HTTP/1.1", '{"mode":"in_place"}'),
        ("POST /continue_generation HTTP/1.1", "{}"),
    ]


@pytest.mark.parametrize("kind", KINDS)
def test_the_reference_engine_takes_each_kinds_hold(kind: str, start_engine: Callable[..., RunningEngine]) -> None:
    engine = start_engine(api=kind)
    address = EngineAddress(engine.url, kind)  # type: ignore[arg-type]
    for mode in ("keep", "abort"):
        paused = pause_engines([address], mode, clear_cache=False)  # type: ignore[arg-type]
        assert [(r["ok"], r["error"]) for r in paused] == [(True, None)]
        resumed = resume_engines([address], f"after-{mode}")
        assert [(r["ok"], r["error"], r["weight_version_set"]) for r in resumed] == [(True, None, True)]
    assert all(engine.client.get(path).status_code == 200 for path in BACKENDS[kind].INFO_PATHS)
