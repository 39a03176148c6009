"""A sandbox's egress: nothing by default; with ``runtime.egress_allow``, CONNECT tunnels to exactly those hosts,
never to the host's own loopback or link-local addresses whatever the list says. A CONNECT head has one deadline
for all of it; a tunnel ends when it goes idle, and when its session ends, whatever the remote host does."""

from __future__ import annotations

import contextlib
import select
import shutil
import socket
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from polar.config import load_config
from polar.contract.task_request import Limits, RuntimeSpec, TaskRequest
from polar.errors import ValidationError
from polar.runtimes import check_confinement, create_runtime
from polar.runtimes.bounds import SandboxBounds
from polar.runtimes.egress import EgressGate
from polar.runtimes.relay import EGRESS_SOCKET_NAME, relay_dir, relayed, remove_relay_dir

HANG_GUARD_S = 60  # socket timeouts of reads that must not time out: hang guards, not speed claims
# How late past its deadline a close may come on a loaded machine: the deadlines are kept by the gate's own
# poll and socket timeouts, so the lateness is a thread's wake-up, not a tick.
MARGIN_S = 0.5


def host_address() -> str:
    """This machine's address on its outgoing interface (not loopback), or a skip."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("10.255.255.255", 1))  # no packet is sent: it only picks the interface
        except OSError:
            pytest.skip("no non-loopback interface")
        return str(probe.getsockname()[0])


@contextlib.contextmanager
def echo_server(host: str) -> Iterator[int]:
    server = socket.create_server((host, 0))

    def serve() -> None:
        while True:
            try:
                client, _ = server.accept()
            except OSError:
                return
            with client:
                client.sendall(b"echo:" + client.recv(100))

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield server.getsockname()[1]
    finally:
        server.close()


@contextlib.contextmanager
def gate(allow: list[str], tmp_path: Path) -> Iterator[str]:
    path = str(tmp_path / "egress.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen()
    threading.Thread(target=EgressGate(allow).serve, args=(listener,), daemon=True).start()
    try:
        yield path
    finally:
        listener.close()


def ask(path: str, head: str) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.settimeout(60)  # a hang guard, not a speed claim
        client.connect(path)
        client.sendall(head.encode())
        answer = client.recv(200)
        if answer.startswith(b"HTTP/1.1 200"):
            client.sendall(b"hi")
            answer += client.recv(100)
        return answer


def test_only_allowed_hosts_and_never_the_hosts_loopback(tmp_path: Path) -> None:
    address = host_address()
    with echo_server(address) as port, echo_server("127.0.0.1") as local_port:
        allow = [f"{address}:{port}", f"localhost:{local_port}"]
        with gate(allow, tmp_path) as path:
            assert ask(path, f"CONNECT {address}:{port} HTTP/1.1\r\n\r\n").endswith(b"\r\n\r\necho:hi")
            refused = {
                "not listed": f"CONNECT {address}:{port + 1} HTTP/1.1\r\n\r\n",
                "loopback by name": f"CONNECT localhost:{local_port} HTTP/1.1\r\n\r\n",
                "plain http": f"GET http://{address}:{port}/ HTTP/1.1\r\n\r\n",
            }
            for why, head in refused.items():
                assert ask(path, head).startswith(b"HTTP/1.1 403"), why


def test_a_task_writes_host_port_entries() -> None:
    base = {"task_id": "t", "instruction": "i", "harness": {"name": "command", "command": "true"}}
    ok = TaskRequest.model_validate({**base, "runtime": {"egress_allow": ["pypi.org:443", "*.github.com:443"]}})
    assert ok.runtime.egress_allow == ["pypi.org:443", "*.github.com:443"]
    with pytest.raises(ValueError, match="host:port"):
        TaskRequest.model_validate({**base, "runtime": {"egress_allow": ["https://pypi.org"]}})


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="NO BWRAP: bubblewrap is not installed")
def test_from_inside_bwrap_the_tunnel_is_the_only_way_out(tmp_path: Path) -> None:
    address = host_address()
    config = load_config({"POLAR_WORK_ROOT": str(tmp_path / "sessions")}, cwd=tmp_path)
    runtime = create_runtime(uuid.uuid4(), RuntimeSpec(backend="bwrap"), config)
    probe = (
        "import os, socket, sys\n"
        "target = sys.argv[1]\n"
        "host, port = target.rsplit(':', 1)\n"
        "try:\n"
        "    socket.create_connection((host, int(port)), timeout=2); print('direct: REACHED')\n"
        "except OSError:\n"
        "    print('direct: blocked')\n"
        "proxy = os.environ['HTTPS_PROXY'].rsplit(':', 1)[1]\n"
        "tunnel = socket.create_connection(('127.0.0.1', int(proxy)), timeout=60)\n"  # a hang guard
        "tunnel.sendall(f'CONNECT {target} HTTP/1.1\\r\\n\\r\\n'.encode())\n"
        "print(tunnel.recv(100).split(b'\\r\\n')[0].decode())\n"
        "tunnel.sendall(b'hi'); print(tunnel.recv(100).decode())\n"
    )
    try:
        with echo_server(address) as port:
            target = f"{address}:{port}"
            with runtime.proxy_access("http://127.0.0.1:80", egress_allow=[target]) as access:
                command = access.wrap([sys.executable, "-c", probe, target])
                result = runtime.exec(command, {"PATH": "/usr/bin:/bin", **access.env}, 120, "egress")  # hang guard
        assert result.output_tail.splitlines() == ["direct: blocked", "HTTP/1.1 200 Connection established", "echo:hi"]
    finally:
        runtime.destroy()


@contextlib.contextmanager
def bounded_gate(allow: list[str], tmp_path: Path, bounds: SandboxBounds) -> Iterator[str]:
    """A gate held to ``bounds`` on a socket of its own; at the end, its listener closed and its tunnels ended."""
    path = str(tmp_path / "egress.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen()
    egress = EgressGate(allow, bounds)
    accepting = threading.Thread(target=egress.serve, args=(listener,), daemon=True)
    accepting.start()
    try:
        yield path
    finally:
        listener.shutdown(socket.SHUT_RDWR)
        listener.close()
        accepting.join(HANG_GUARD_S)
        egress.served.end()


def tunnel(path: str | Path, target: str) -> socket.socket:
    """A connection to the gate at ``path`` with its tunnel to ``target`` established."""
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.settimeout(HANG_GUARD_S)
    client.connect(str(path))
    client.sendall(f"CONNECT {target} HTTP/1.1\r\n\r\n".encode())
    assert client.recv(200) == b"HTTP/1.1 200 Connection established\r\n\r\n"
    return client


def test_a_trickled_connect_head_is_closed_at_its_total_deadline(tmp_path: Path) -> None:
    """A byte every 50 ms: each read is in time, the whole head is not. The gate closes it at the head's deadline,
    counted from the connection, never before it and at most MARGIN_S after."""
    deadline_s, every_s = 1.0, 0.05
    head = b"CONNECT example.org:443 HTTP/1.1\r\nX-Padding: " + b"a" * 400  # 20 s of trickle: never finished
    with bounded_gate(["example.org:443"], tmp_path, SandboxBounds(request_send_s=deadline_s)) as path:
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        client.settimeout(HANG_GUARD_S)
        started = time.monotonic()  # before the connect: the gate's deadline starts after it
        client.connect(path)
        with client:
            sent = 0
            with contextlib.suppress(OSError):  # the gate may close while a byte is on its way
                while sent < len(head) and not select.select([client], [], [], every_s)[0]:
                    client.send(head[sent : sent + 1])
                    sent += 1
            closed_after = time.monotonic() - started
            assert client.recv(200).startswith(b"HTTP/1.1 403")
    assert deadline_s <= closed_after < deadline_s + MARGIN_S, closed_after
    assert 1 < sent < len(head)


def test_a_tunnel_the_remote_never_closes_ends_with_its_session_and_so_do_its_threads(tmp_path: Path) -> None:
    """Two tunnels through the session's relay (``relayed``, as ``runtime.proxy_access`` opens it) to a server
    that never closes and never answers: one the sandbox keeps open, one it has finished sending on (which only
    the remote could end). Neither goes idle here; when the session's block ends, both are closed, both
    ends, and every thread the session started is gone."""
    address = host_address()
    session_dir = tmp_path / "session"
    session_dir.mkdir()
    bounds = SandboxBounds(tunnel_idle_s=HANG_GUARD_S * 10)
    with socket.create_server((address, 0)) as server:
        target = f"{address}:{server.getsockname()[1]}"
        before = set(threading.enumerate())
        with relayed(session_dir, "http://127.0.0.1:9", egress_allow=[target], bounds=bounds):
            path = relay_dir(session_dir) / EGRESS_SOCKET_NAME
            held, finished = tunnel(path, target), tunnel(path, target)
            remotes = {}
            for client, word in ((held, b"held"), (finished, b"done")):
                client.sendall(word)
                remote = server.accept()[0]
                remote.settimeout(HANG_GUARD_S)
                assert remote.recv(4) == word
                remotes[word] = remote
            finished.shutdown(socket.SHUT_WR)
            assert remotes[b"done"].recv(1) == b""  # the sandbox's end of it reached the remote, which stays
            assert not select.select([held, finished], [], [], 0.2)[0]  # both tunnels open: the remote holds them
            started = set(threading.enumerate()) - before
            assert len(started) >= 2 + 2 * 2  # both sockets' accept loops, two threads a tunnel
        assert not [thread for thread in started if thread.is_alive()]
        for end in [held, finished, remotes[b"held"]]:
            with end:
                end.settimeout(HANG_GUARD_S)
                assert end.recv(1) == b""  # closed by the gate
        remotes[b"done"].close()
    remove_relay_dir(session_dir)


def test_an_idle_tunnel_is_closed_after_the_idle_timeout_and_bytes_either_way_keep_it(tmp_path: Path) -> None:
    """For twice the idle limit only the remote speaks, a byte each fifth of it: the tunnel stays open both ways.
    Then nothing: both ends are closed once the limit has passed since the last byte, never before and at most
    MARGIN_S after."""
    idle_s = 1.0
    address = host_address()
    with socket.create_server((address, 0)) as server:
        target = f"{address}:{server.getsockname()[1]}"
        with bounded_gate([target], tmp_path, SandboxBounds(tunnel_idle_s=idle_s)) as path:
            client = tunnel(path, target)
            remote, _ = server.accept()
            remote.settimeout(HANG_GUARD_S)
            with client, remote:
                for _ in range(10):
                    time.sleep(idle_s / 5)
                    remote.sendall(b"x")
                    assert client.recv(1) == b"x"
                client.sendall(b"y")  # the sandbox's side was quiet all along, and is still carried
                assert remote.recv(1) == b"y"
                quiet_from = time.monotonic()  # before the last byte: the gate sees it after this
                remote.sendall(b"z")
                assert client.recv(1) == b"z"
                assert client.recv(1) == b""
                closed_after = time.monotonic() - quiet_from
                assert remote.recv(1) == b""  # the remote's end too
    assert idle_s <= closed_after < idle_s + MARGIN_S, closed_after


def test_the_idle_limit_is_the_tasks_or_the_deployments_and_local_refuses_it(tmp_path: Path) -> None:
    config = load_config({"POLAR_SANDBOX_TUNNEL_IDLE_S": "7"}, cwd=tmp_path)
    assert SandboxBounds.of_task(config, Limits()).tunnel_idle_s == 7.0
    assert SandboxBounds.of_task(config, Limits(tunnel_idle_s=2)).tunnel_idle_s == 2.0
    assert SandboxBounds.of_task(load_config({}, cwd=tmp_path)).tunnel_idle_s == 300.0
    check_confinement(RuntimeSpec(backend="bwrap", limits=Limits(tunnel_idle_s=2)), "runtime")
    with pytest.raises(ValidationError, match="tunnel_idle_s"):
        check_confinement(RuntimeSpec(backend="local", limits=Limits(tunnel_idle_s=2)), "runtime")
    with pytest.raises(ValidationError, match="POLAR_SANDBOX_TUNNEL_IDLE_S"):
        load_config({"POLAR_SANDBOX_TUNNEL_IDLE_S": "0"}, cwd=tmp_path)
