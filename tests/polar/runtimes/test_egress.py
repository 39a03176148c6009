"""A sandbox's egress: nothing by default; with ``runtime.egress_allow``, CONNECT tunnels to exactly those hosts,
never to the host's own loopback or link-local addresses whatever the list says."""

from __future__ import annotations

import contextlib
import shutil
import socket
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from polar.config import load_config
from polar.contract.task_request import RuntimeSpec, TaskRequest
from polar.runtimes import create_runtime
from polar.runtimes.egress import EgressGate


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
