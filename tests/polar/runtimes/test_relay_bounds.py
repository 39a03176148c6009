"""The relay and egress gate hold a sandbox to its bounds: connections at once (and so threads), time to send a
request, bytes; the proxy gets its own Host whatever the sandbox sent; the gate reaches only global addresses
unless an entry names the literal IP."""

from __future__ import annotations

import contextlib
import json
import select
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from polar.config import load_config
from polar.contract.task_request import Limits, RuntimeSpec
from polar.errors import ValidationError
from polar.runtimes import check_confinement
from polar.runtimes.bounds import SandboxBounds
from polar.runtimes.egress import EgressGate, Refused
from polar.runtimes.relay import ProxyRelay, ProxyTarget
from tests.processes import wait_until
from tests.scripted_http import ScriptedServer

HANG_GUARD_S = 30  # socket timeouts of reads that must not time out: hang guards on a loaded machine


@contextlib.contextmanager
def deaf_relay(tmp_path: Path, bounds: SandboxBounds) -> Iterator[tuple[ProxyRelay, socket.socket]]:
    """A relay whose proxy accepts connections (the kernel does, into its backlog) but never reads them: nothing
    on the proxy's side ends a connection, or runs a thread of its own."""
    with socket.create_server(("127.0.0.1", 0)) as deaf:
        target = ProxyTarget.from_url(f"http://127.0.0.1:{deaf.getsockname()[1]}")
        proxy_relay = ProxyRelay(tmp_path, target, bounds=bounds)
        proxy_relay.start()
        try:
            yield proxy_relay, deaf
        finally:
            proxy_relay.stop()


@contextlib.contextmanager
def relay(tmp_path: Path, bounds: SandboxBounds) -> Iterator[tuple[str, ScriptedServer]]:
    upstream = ScriptedServer()  # a stand-in proxy: answers every request ok, keeping alive
    target = ProxyTarget.from_url(f"http://127.0.0.1:{upstream.port}")
    proxy_relay = ProxyRelay(tmp_path, target, bounds=bounds)
    proxy_relay.start()
    try:
        yield str(proxy_relay.path), upstream
    finally:
        proxy_relay.stop()
        upstream.close()


def connect(path: str) -> socket.socket:
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.connect(path)  # blocking: a full backlog waits for the accept loop rather than failing
    client.settimeout(HANG_GUARD_S)
    return client


def answer(client: socket.socket) -> bytes:
    """What comes back until the answer's end (``ok``) or the connection's."""
    got = b""
    while not got.endswith(b"ok") and (chunk := client.recv(65536)):
        got += chunk
    return got


def error_of(raw: bytes) -> tuple[int, dict]:  # type: ignore[type-arg]
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), json.loads(body)


def test_the_proxy_gets_its_own_host_and_keep_alive_works(tmp_path: Path) -> None:
    with relay(tmp_path, SandboxBounds()) as (path, upstream), connect(path) as client:
        body = b'{"model":"m"}'
        request = b"POST /s/k/v1/chat/completions HTTP/1.1\r\nHost: vllm.internal\r\nContent-Length: %d\r\n\r\n%s"
        client.sendall(request % (len(body), body))
        assert answer(client).endswith(b"\r\n\r\nok")
        chunked = (
            b"POST /v1/messages HTTP/1.1\r\nhost: grafana\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
        )
        client.sendall(chunked)
        assert answer(client).endswith(b"\r\n\r\nok")
    first, second = upstream.requests
    for request in (first, second):
        hosts = [line for line in request.split(b"\r\n") if line.lower().startswith(b"host:")]
        assert hosts == [f"Host: 127.0.0.1:{upstream.port}".encode()]
    assert first.endswith(body) and second.endswith(b"abc")
    assert upstream.connections == 1


def test_connections_past_the_bound_are_refused_and_threads_stay_bounded(tmp_path: Path) -> None:
    bounds = SandboxBounds(connections=4, request_send_s=HANG_GUARD_S)
    before = threading.active_count()
    with relay(tmp_path, bounds) as (path, upstream):
        held = []
        for _ in range(300):
            held.append(connect(path))
        peak = threading.active_count()
        # The first four are served (waiting for their heads); every later one was answered 503 and closed.
        refusals = [client.recv(1000) for client in held[4:]]
        assert all(error_of(raw)[0] == 503 for raw in refusals)
        assert upstream.connections == 0  # no request head came: nothing reached the proxy
        for client in held:
            client.close()
    # The stand-in proxy's accept thread and the relay's accept loop, and one thread per served connection.
    assert peak - before <= 2 + bounds.threads()


def test_a_request_not_sent_in_time_gets_408_and_never_reaches_the_proxy(tmp_path: Path) -> None:
    with relay(tmp_path, SandboxBounds(request_send_s=0.5)) as (path, upstream), connect(path) as client:
        client.sendall(b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Len")  # and then nothing more
        status, body = error_of(answer(client))
    assert status == 408 and body["type"] == "error"  # Anthropic's shape: the path names its protocol
    assert upstream.connections == 0


def test_a_body_over_the_cap_is_refused_before_it_is_read(tmp_path: Path) -> None:
    bounds = SandboxBounds(request_bytes=1000)
    with relay(tmp_path, bounds) as (path, upstream), connect(path) as client:
        client.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1001\r\n\r\n")
        status, body = error_of(answer(client))
    assert status == 413 and "error" in body and upstream.connections == 0


@pytest.mark.parametrize(
    "head",
    [
        b"POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
        b"GET / HTTP/1.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
        b"GET / HTTP/1.1\r\nX-A: 1\r\n folded\r\n\r\n",
        b"GET / HTTP/2.0\r\n\r\n",
    ],
)
def test_framing_the_relay_cannot_count_is_refused(tmp_path: Path, head: bytes) -> None:
    with relay(tmp_path, SandboxBounds()) as (path, upstream), connect(path) as client:
        client.sendall(head)
        assert error_of(answer(client))[0] == 400
    assert upstream.connections == 0


@pytest.mark.parametrize("size", [b"-1", b"-10", b"0x5", b"+5", b"1_0", b"", b"12345678901234567", b"5\x0b"])
def test_chunk_sizes_the_relay_cannot_count_are_refused(tmp_path: Path, size: bytes) -> None:
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    with deaf_relay(tmp_path, SandboxBounds()) as (proxy_relay, deaf), connect(str(proxy_relay.path)) as client:
        client.sendall(head + size + b"\r\n" + b"A" * 100)
        assert error_of(answer(client))[0] == 400
        proxy, _ = deaf.accept()
        with proxy:
            proxy.settimeout(HANG_GUARD_S)
            carried = b""
            while chunk := proxy.recv(65536):
                carried += chunk
    assert carried.endswith(b"Transfer-Encoding: chunked\r\n\r\n")  # the head went; nothing of the body did


def test_a_content_length_of_thousands_of_digits_is_refused_unread(tmp_path: Path) -> None:
    with relay(tmp_path, SandboxBounds()) as (path, upstream), connect(path) as client:
        client.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: " + b"9" * 5000 + b"\r\n\r\n")
        assert error_of(answer(client))[0] == 413
    assert upstream.connections == 0


def test_no_connection_outlives_the_relay(tmp_path: Path) -> None:
    """A connection blocked in the middle of its body, one that sent a negative chunk size, and one carried to the
    proxy and waiting on its answer: when the relay stops, every thread it started has ended."""
    before = threading.active_count()
    bounds = SandboxBounds(request_send_s=HANG_GUARD_S * 10)  # no deadline ends them while the test runs
    with deaf_relay(tmp_path, bounds) as (proxy_relay, deaf):
        clients = [connect(str(proxy_relay.path)) for _ in range(3)]
        post = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
        clients[0].sendall(post + b"Content-Length: 1000\r\n\r\n" + b"A" * 10)
        clients[1].sendall(post + b"Transfer-Encoding: chunked\r\n\r\n-10\r\n" + b"A" * 100)
        clients[2].sendall(post + b"Content-Length: 2\r\n\r\nhi")
        proxies = [deaf.accept()[0] for _ in range(3)]  # every head reached the proxy: each connection is carried
        assert threading.active_count() > before
        proxy_relay.stop()
        assert threading.active_count() == before
        for client in clients:
            with client:
                while client.recv(65536):  # the relay ended its side (after a refusal, for the chunked one)
                    pass
        for proxy in proxies:
            with proxy:
                proxy.settimeout(HANG_GUARD_S)
                while proxy.recv(65536):  # and the proxy's side too
                    pass


@contextlib.contextmanager
def gate_serving(tmp_path: Path, bounds: SandboxBounds) -> Iterator[tuple[str, EgressGate]]:
    """An egress gate on a socket of its own; at the end, its listener closed and its connections ended."""
    path = str(tmp_path / "egress.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen()
    gate = EgressGate(["example.org:443"], bounds)
    accepting = threading.Thread(target=gate.serve, args=(listener,), daemon=True)
    accepting.start()
    try:
        yield path, gate
    finally:
        listener.shutdown(socket.SHUT_RDWR)
        listener.close()
        accepting.join(HANG_GUARD_S)
        gate.served.end()


def test_a_trickled_connect_head_is_refused_at_the_deadline(tmp_path: Path) -> None:
    head = b"CONNECT example.org:443 HTTP/1.1\r\nX-Padding: " + b"a" * 2000
    with gate_serving(tmp_path, SandboxBounds(request_send_s=0.5)) as (path, _gate), connect(path) as client:
        sent = 0
        with contextlib.suppress(OSError):  # the gate may close while a byte is on its way
            while sent < len(head) and not select.select([client], [], [], 0.1)[0]:
                client.send(head[sent : sent + 1])  # a byte every 0.1s: each read on its own is in time
                sent += 1
        assert client.recv(200).startswith(b"HTTP/1.1 403")
    assert sent < len(head)  # refused while the head still trickled in: the deadline is for all of it


def test_no_connection_outlives_the_gate(tmp_path: Path) -> None:
    before = threading.active_count()
    with gate_serving(tmp_path, SandboxBounds(request_send_s=HANG_GUARD_S * 10)) as (path, gate):
        held = connect(path)
        held.sendall(b"CONNECT example.org:443 HTTP/1.1\r\n")  # its head unfinished: only the end ends it
        wait_until(lambda: gate.served.threads(), HANG_GUARD_S, "the connection served")
    assert threading.active_count() == before  # the accept loop and the connection's thread have ended
    with held:
        assert held.recv(200) == b""  # its connection was ended too


@pytest.mark.parametrize("address", ["100.100.100.200", "100.64.0.1", "192.0.2.1", "::ffff:169.254.169.254"])
def test_the_gate_refuses_addresses_that_are_not_global(address: str) -> None:
    gate = EgressGate(["*:80"])
    with pytest.raises(Refused, match="may not reach"):
        gate.open(f"[{address}]:80" if ":" in address else f"{address}:80")


def test_an_entry_naming_the_literal_ip_may_reach_it() -> None:
    with socket.create_server(("127.0.0.2", 0)) as server:  # loopback is never allowed: the rule is for others
        port = server.getsockname()[1]
        with pytest.raises(Refused, match="may not reach"):
            EgressGate([f"127.0.0.2:{port}"]).open(f"127.0.0.2:{port}")
    gate = EgressGate(["100.100.100.200:80"])
    assert gate._entry_for("100.100.100.200", 80) is not None


def test_an_idle_connect_head_is_dropped_at_the_deadline(tmp_path: Path) -> None:
    path = str(tmp_path / "egress.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen()
    gate = EgressGate(["example.org:443"], SandboxBounds(request_send_s=0.5))
    threading.Thread(target=gate.serve, args=(listener,), daemon=True).start()
    try:
        with connect(path) as client:
            client.sendall(b"CONNECT example.org:443 HTTP/1.1\r\n")  # never finished
            assert client.recv(200).startswith(b"HTTP/1.1 403")
    finally:
        listener.close()


def test_a_tasks_bounds_win_over_the_deployments_and_local_refuses_them(tmp_path: Path) -> None:
    env = {"POLAR_SANDBOX_MAX_CONNECTIONS": "7", "POLAR_SANDBOX_REQUEST_SEND_S": "5"}
    config = load_config(env, cwd=tmp_path)
    assert SandboxBounds.of_task(config, Limits()) == SandboxBounds(7, 5.0, config.max_body_bytes)
    assert SandboxBounds.of_task(config, Limits(connections=3, request_send_s=2)).connections == 3
    check_confinement(RuntimeSpec(backend="bwrap", limits=Limits(connections=3)), "runtime")
    with pytest.raises(ValidationError, match="connections"):
        check_confinement(RuntimeSpec(backend="local", limits=Limits(connections=3)), "runtime")


def test_a_thread_that_cannot_start_fails_its_connection_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with relay(tmp_path, SandboxBounds()) as (path, _upstream):
        real_start = threading.Thread.start
        failures = iter([True])

        def start(self: threading.Thread) -> None:
            if next(failures, False):
                raise RuntimeError("can't start new thread")
            real_start(self)

        monkeypatch.setattr(threading.Thread, "start", start)
        with connect(path) as first:
            assert first.recv(10) == b""  # closed: no thread could serve it
        monkeypatch.undo()
        with connect(path) as second:  # the accept loop lives on
            second.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
            assert answer(second).endswith(b"\r\n\r\nok")
