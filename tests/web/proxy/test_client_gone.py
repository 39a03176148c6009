"""``web.proxy.delivery.client_gone`` on a real socket pair: open, closed by its peer, and past descriptor 1,023."""

from __future__ import annotations

import resource
import socket

from web.proxy.delivery import client_gone


def test_a_closed_peer_reads_as_gone_and_an_open_one_with_data_does_not() -> None:
    server, client = socket.socketpair()
    with server, client:
        assert client_gone({"gunicorn.socket": server}) is False
        client.sendall(b"GET / HTTP/1.1\r\n\r\n")  # a pipelined next request is data, not gone
        assert client_gone({"gunicorn.socket": server}) is False
        server.recv(100)
        client.close()
        assert client_gone({"gunicorn.socket": server}) is True
    assert client_gone({}) is False  # a server that does not expose its socket


def test_descriptors_past_1023_are_checked() -> None:
    """A busy proxy process holds more than 1,023 descriptors (``select`` refused those with a ValueError)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4096)), hard))
    held = [socket.socket() for _ in range(1100)]
    try:
        server, client = socket.socketpair()
        with server:
            assert server.fileno() > 1023
            assert client_gone({"gunicorn.socket": server}) is False
            client.close()
            assert client_gone({"gunicorn.socket": server}) is True
    finally:
        for sock in held:
            sock.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
