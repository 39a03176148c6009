"""The engine pool against real reference engines: pinning, skipping dead engines, truthful failures."""

from __future__ import annotations

import socket
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from polar.errors import ENGINE_TIMEOUT, GENERATION_TIMEOUT, UNREACHABLE, EngineError, EngineTimeout
from polar.fleet.engines import EnginePool
from polar.local.launcher import Stack, engine_spec, free_port

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}
HANG_GUARD_S = 60  # engine timeouts that must not fire: hang guards on a loaded machine (not the 504 test's bound)


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    ports = {"a": free_port(), "b": free_port(), "slow": free_port()}
    specs = [
        engine_spec(ports["a"], "echo", name="a"),
        engine_spec(ports["b"], "echo", name="b"),
        engine_spec(ports["slow"], "echo", ["--decode-rate", "2"], name="slow"),
    ]
    logs: Path = tmp_path_factory.mktemp("engines")
    with Stack(specs, {}, logs):
        yield {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}


def test_a_session_stays_on_its_engine_and_sessions_spread(engines: dict[str, str]) -> None:
    pool = EnginePool([engines["a"], engines["b"]], timeout_s=HANG_GUARD_S)
    used = set()
    for _ in range(20):
        session = uuid.uuid4()
        urls = {pool.post(session, "/v1/chat/completions", dict(CHAT), None).url for _ in range(3)}
        assert len(urls) == 1
        used |= urls
    assert used == {engines["a"], engines["b"]}


def test_dead_engines_are_skipped(engines: dict[str, str]) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    # Down engines cool down for longer than these ten calls take, however loaded the machine.
    pool = EnginePool([dead, engines["a"]], timeout_s=HANG_GUARD_S, cooldown_s=600)
    replies = [pool.post(uuid.uuid4(), "/v1/chat/completions", dict(CHAT), None) for _ in range(10)]
    assert {r.url for r in replies} == {engines["a"]} and all(r.status_code == 200 for r in replies)
    assert pool.order(uuid.uuid4())[-1] == dead  # down engines go last while cooling down


def test_no_engine_reachable_is_a_502(engines: dict[str, str]) -> None:
    pool = EnginePool([f"http://127.0.0.1:{free_port()}"], timeout_s=HANG_GUARD_S)
    with pytest.raises(EngineError) as caught:
        pool.post(uuid.uuid4(), "/v1/chat/completions", dict(CHAT), None)
    assert caught.value.status_code == 502 and "no engine reachable" in str(caught.value)
    assert caught.value.failure_kind == UNREACHABLE


def test_a_slow_engine_is_a_504(engines: dict[str, str]) -> None:
    pool = EnginePool([engines["slow"]], timeout_s=0.5)
    with pytest.raises(EngineTimeout) as caught:
        pool.post(uuid.uuid4(), "/v1/chat/completions", {**CHAT, "max_tokens": 64}, None)
    assert caught.value.status_code == 504


def test_a_timeout_says_whether_the_engine_was_generating_the_call(engines: dict[str, str]) -> None:
    """Healthy, nothing waiting: the call was being generated (the policy asked that much). Requests queued, or an
    engine that does not answer its /health: the engine's."""
    pool = EnginePool([engines["slow"]], timeout_s=0.5)
    with pytest.raises(EngineTimeout) as generating:
        pool.post(uuid.uuid4(), "/v1/chat/completions", {**CHAT, "max_tokens": 64}, None)
    assert generating.value.failure_kind == GENERATION_TIMEOUT and "none waiting" in str(generating.value)
    # Paused (vLLM's mode=keep): a new request waits for a slot, counted as waiting.
    assert httpx.post(f"{engines['slow']}/pause", params={"mode": "keep"}, timeout=HANG_GUARD_S).status_code == 200
    try:
        with pytest.raises(EngineTimeout) as queued:
            pool.post(uuid.uuid4(), "/v1/chat/completions", {**CHAT, "max_tokens": 64}, None)
    finally:
        httpx.post(f"{engines['slow']}/resume", timeout=HANG_GUARD_S)
    assert queued.value.failure_kind == ENGINE_TIMEOUT and "1 requests waiting" in str(queued.value)
    pool.close()

    silent = socket.create_server(("127.0.0.1", 0))  # takes connections, never answers: not even its /health
    try:
        pool = EnginePool([f"http://127.0.0.1:{silent.getsockname()[1]}"], timeout_s=0.5)
        with pytest.raises(EngineTimeout) as stuck:
            pool.post(uuid.uuid4(), "/v1/chat/completions", dict(CHAT), "m")
        assert stuck.value.failure_kind == ENGINE_TIMEOUT and "/health did not answer" in str(stuck.value)
        pool.close()
    finally:
        silent.close()


def test_engine_4xx_comes_back_as_a_reply(engines: dict[str, str]) -> None:
    pool = EnginePool([engines["a"]], timeout_s=HANG_GUARD_S)
    reply = pool.post(uuid.uuid4(), "/v1/chat/completions", dict(CHAT), "no-such-model")
    assert reply.status_code == 404 and "does not exist" in reply.error_message
    assert pool.served_model(engines["a"]) == "polar-reference"


def test_max_tokens_beyond_the_context_is_fitted_to_the_room_left(engines: dict[str, str]) -> None:
    from polar.fleet.backends.vllm import fit_max_tokens

    pool = EnginePool([engines["a"]], timeout_s=HANG_GUARD_S)
    body = {**CHAT, "max_tokens": 64000}
    refused = pool.post(uuid.uuid4(), "/v1/chat/completions", dict(body), None)
    assert refused.status_code == 400 and "maximum context length" in refused.error_message
    fitted = fit_max_tokens(body, refused)
    assert fitted is not None and 0 < fitted["max_tokens"] < 32768
    assert pool.post(uuid.uuid4(), "/v1/chat/completions", fitted, None).status_code == 200
    assert fit_max_tokens(fitted, refused) is None  # nothing left to cut: no second retry


@pytest.fixture
def recording_engine() -> Iterator[tuple[str, list[dict[str, str]]]]:
    """A stand-in engine that answers every request with a fixed chat completion and keeps each one's headers."""
    seen: list[dict[str, str]] = []

    class Handler(BaseHTTPRequestHandler):
        def _answer(self, body: bytes) -> None:
            seen.append({name.lower(): value for name, value in self.headers.items()})
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # /v1/models
            self._answer(b'{"data": [{"id": "m"}]}')

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            self._answer(b'{"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}]}')

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def test_an_engine_urls_credentials_are_sent_as_basic_auth(recording_engine: tuple[str, list[dict[str, str]]]) -> None:
    host, seen = recording_engine
    pool = EnginePool([f"http://polar:s%40cret@{host}"], timeout_s=HANG_GUARD_S)
    assert pool.post(uuid.uuid4(), "/v1/chat/completions", dict(CHAT), None).status_code == 200
    # base64("polar:s@cret"), on the model lookup and on the call itself
    assert [headers.get("authorization") for headers in seen] == ["Basic cG9sYXI6c0BjcmV0"] * 2
    pool.close()


def test_an_engine_that_drops_the_connection_before_answering_is_skipped(engines: dict[str, str]) -> None:
    dropping = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def drop() -> None:  # accept, read what arrives, close without a byte back: an engine dying mid-call
        dropping.settimeout(0.2)
        while not stop.is_set():
            try:
                connection, _ = dropping.accept()
            except TimeoutError:
                continue
            connection.recv(65536)
            connection.close()

    thread = threading.Thread(target=drop, daemon=True)
    thread.start()
    try:
        pool = EnginePool([f"http://127.0.0.1:{dropping.getsockname()[1]}", engines["a"]], timeout_s=HANG_GUARD_S)
        reply = pool.post(uuid.uuid4(), "/v1/chat/completions", dict(CHAT), "polar-reference")
        assert reply.url == engines["a"] and reply.status_code == 200
        assert pool.order(uuid.uuid4())[-1] != engines["a"]  # the dropping engine is down and goes last
    finally:
        stop.set()
        thread.join()
        dropping.close()


def test_failures_never_show_an_engine_urls_credentials() -> None:
    # The message reaches the harness (its error body) and the stored call: the URL's user info must not.
    pool = EnginePool(
        [f"http://polar:s3cret-token@127.0.0.1:{free_port()}/?api_key=s3cret-query"], timeout_s=HANG_GUARD_S
    )
    with pytest.raises(EngineError) as failed:
        pool.post(uuid.uuid4(), "/v1/chat/completions", dict(CHAT), "m")
    assert "s3cret" not in str(failed.value) and "127.0.0.1" in str(failed.value)


@pytest.mark.parametrize(
    ("raw", "parsed"),
    [
        ("http://127.0.0.1:8000/", ("http://127.0.0.1:8000", "vllm")),
        ("sglang+https://gpu-3.internal:30000", ("https://gpu-3.internal:30000", "sglang")),
        ("vllm+http://user:s3cret@h:1/v?x=1", ("http://user:s3cret@h:1/v?x=1", "vllm")),
    ],
)
def test_engine_urls_that_parse(raw: str, parsed: tuple[str, str]) -> None:
    from polar.contract.engine_addresses import parse_engine_url

    address = parse_engine_url(raw)
    assert (address.url, address.kind) == parsed


@pytest.mark.parametrize(
    "raw",
    [
        "",
        "127.0.0.1:8000",
        "ftp://h",
        "http://",
        "http://h:65536",
        "http://[::::]",
        "tgi+http://h",
        "http://h h",
        " http://h",
    ],
)
def test_engine_urls_refused_by_the_parser_and_the_api_schema(raw: str) -> None:
    import re

    from polar.contract.engine_addresses import ENGINE_URL_PATTERN, parse_engine_url
    from polar.errors import ValidationError

    with pytest.raises(ValidationError):
        parse_engine_url(raw)
    assert re.fullmatch(ENGINE_URL_PATTERN, raw) is None  # what /openapi.json calls valid, the parser takes
