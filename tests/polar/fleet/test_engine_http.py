"""The proxy's engine client against a scripted HTTP server on a real socket: framing, keep-alive, and each
failure told apart the way the engine pool needs it."""

from __future__ import annotations

import resource
import socket
import time
from collections.abc import Callable, Iterator

import pytest

from polar.fleet.engine_http import Dropped, EngineHttp, Origin, TimedOut, Unreachable
from polar.local.launcher import free_port
from tests.scripted_http import Script, ScriptedServer


@pytest.fixture
def serve() -> Iterator[Callable[[Script], ScriptedServer]]:
    servers: list[ScriptedServer] = []

    def start(script: Script) -> ScriptedServer:
        servers.append(ScriptedServer(script))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def _ok(body: bytes = b'{"ok":true}', extra: bytes = b"") -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        + extra
        + b"Content-Length: %d\r\n\r\n" % len(body)
        + body
    )


def _client(read_timeout_s: float = 5.0) -> EngineHttp:
    return EngineHttp(connect_timeout_s=2.0, read_timeout_s=read_timeout_s)


def test_requests_share_a_kept_alive_connection(serve: Callable[[Script], ScriptedServer]) -> None:
    server = serve(lambda head, body: (_ok(b'{"echo":' + body + b"}"), False))
    client, origin = _client(), Origin.of(f"http://127.0.0.1:{server.port}")
    for n in range(5):
        assert client.request(origin, "POST", "/v1/chat/completions", b"%d" % n) == (200, b'{"echo":%d}' % n)
    assert server.connections == 1
    first = server.requests[0]
    assert first.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
    assert f"Host: 127.0.0.1:{server.port}\r\n".encode() in first and b"Content-Type: application/json" in first


def test_a_base_path_and_credentials_in_the_url(serve: Callable[[Script], ScriptedServer]) -> None:
    server = serve(lambda head, body: (_ok(), False))
    origin = Origin.of(f"http://us%40er:p%3Ass@127.0.0.1:{server.port}/engine/")
    _client().request(origin, "GET", "/v1/models")
    sent = server.requests[0]
    assert sent.startswith(b"GET /engine/v1/models HTTP/1.1\r\n")
    assert b"Authorization: Basic dXNAZXI6cDpzcw==\r\n" in sent  # base64 of "us@er:p:ss"
    assert b"us%40er" not in sent


def test_chunked_and_connection_framed_bodies(serve: Callable[[Script], ScriptedServer]) -> None:
    chunked = b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\n{"a"\r\n3;x=1\r\n:1}\r\n0\r\nT: v\r\n\r\n'
    server = serve(lambda head, body: (chunked, False))
    client, origin = _client(), Origin.of(f"http://127.0.0.1:{server.port}")
    assert client.request(origin, "POST", "/x", b"{}") == (200, b'{"a":1}')
    assert client.request(origin, "POST", "/x", b"{}") == (200, b'{"a":1}')
    assert server.connections == 1

    closing = serve(lambda head, body: (b"HTTP/1.0 200 OK\r\n\r\n" + b"x" * 100_000, True))
    origin = Origin.of(f"http://127.0.0.1:{closing.port}")
    assert client.request(origin, "POST", "/x", b"{}") == (200, b"x" * 100_000)
    assert client.request(origin, "POST", "/x", b"{}")[0] == 200
    assert closing.connections == 2  # an answer framed by the connection's end leaves nothing to keep


def test_an_interim_answer_is_skipped_and_connection_close_honoured(serve: Callable[[Script], ScriptedServer]) -> None:
    server = serve(lambda head, body: (b"HTTP/1.1 100 Continue\r\n\r\n" + _ok(extra=b"Connection: close\r\n"), True))
    client, origin = _client(), Origin.of(f"http://127.0.0.1:{server.port}")
    assert client.request(origin, "POST", "/x", b"{}") == (200, b'{"ok":true}')
    assert client.request(origin, "POST", "/x", b"{}") == (200, b'{"ok":true}')
    assert server.connections == 2


def test_a_kept_connection_the_engine_closed_is_not_a_failure(serve: Callable[[Script], ScriptedServer]) -> None:
    server = serve(lambda head, body: (_ok(), False))
    client, origin = _client(), Origin.of(f"http://127.0.0.1:{server.port}")
    assert client.request(origin, "POST", "/x", b"{}")[0] == 200
    server.drop_connections()  # the engine restarted its workers, or timed the idle connection out
    time.sleep(0.05)
    assert client.request(origin, "POST", "/x", b"{}")[0] == 200
    assert server.connections == 2


def test_a_closed_kept_connection_noticed_only_by_the_request_is_sent_again(
    serve: Callable[[Script], ScriptedServer],
) -> None:
    answered = []

    def once_then_hang_up(head: bytes, body: bytes) -> tuple[bytes, bool] | None:
        answered.append(body)
        return (_ok(), False) if len(answered) != 2 else None  # the 2nd request: closed as it arrives

    server = serve(once_then_hang_up)
    client, origin = _client(), Origin.of(f"http://127.0.0.1:{server.port}")
    assert client.request(origin, "POST", "/x", b"1")[0] == 200
    assert client.request(origin, "POST", "/x", b"2")[0] == 200
    assert answered == [b"1", b"2", b"2"] and server.connections == 2


def test_failures_are_told_apart(serve: Callable[[Script], ScriptedServer]) -> None:
    client = _client(read_timeout_s=0.3)
    with pytest.raises(Unreachable):
        client.request(Origin.of(f"http://127.0.0.1:{free_port()}"), "POST", "/x", b"{}")

    hangs_up = serve(lambda head, body: None)
    with pytest.raises(Dropped):
        client.request(Origin.of(f"http://127.0.0.1:{hangs_up.port}"), "POST", "/x", b"{}")

    short = serve(lambda head, body: (b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"cut', True))
    with pytest.raises(Dropped, match="5 of 100"):
        client.request(Origin.of(f"http://127.0.0.1:{short.port}"), "POST", "/x", b"{}")

    garbage = serve(lambda head, body: (b"SSH-2.0-OpenSSH\r\n\r\n", True))
    with pytest.raises(Dropped, match="not an HTTP/1 answer"):
        client.request(Origin.of(f"http://127.0.0.1:{garbage.port}"), "POST", "/x", b"{}")

    def slow(head: bytes, body: bytes) -> tuple[bytes, bool]:
        time.sleep(1.0)
        return _ok(), True

    with pytest.raises(TimedOut):
        client.request(Origin.of(f"http://127.0.0.1:{serve(slow).port}"), "POST", "/x", b"{}")


def test_origins_refuse_what_is_not_http() -> None:
    with pytest.raises(ValueError):
        Origin.of("ftp://127.0.0.1:21")
    assert Origin.of("https://engine.example").port == 443
    assert b"Host: engine.example\r\n" in Origin.of("https://engine.example").headers


def test_connections_are_kept_past_descriptor_1023(serve: Callable[[Script], ScriptedServer]) -> None:
    """A busy proxy process holds more than 1,023 descriptors: its kept connections are checked all the same
    (``select`` refused such a descriptor, and every request then paid a new connection)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4096)), hard))
    held = [socket.socket() for _ in range(1100)]
    try:
        server = serve(lambda head, body: (_ok(), False))
        client, origin = _client(), Origin.of(f"http://127.0.0.1:{server.port}")
        for _ in range(3):
            assert client.request(origin, "POST", "/x", b"{}")[0] == 200
        assert server.connections == 1
    finally:
        for sock in held:
            sock.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
