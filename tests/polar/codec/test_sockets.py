"""``polar.codec.sockets``: readiness by ``poll``, for any descriptor number, without waiting unless asked."""

from __future__ import annotations

import os
import socket

from polar.codec.sockets import readable, writable


def test_readable_when_bytes_wait_or_the_peer_ended() -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        assert not readable(ours)
        assert writable(ours)
        theirs.sendall(b"x")
        assert readable(ours, None)
        assert ours.recv(1) == b"x"
        assert not readable(ours.fileno(), 0.01)
        theirs.close()
        assert readable(ours)  # the end reads as readable: recv says b""
        assert ours.recv(1) == b""


def test_a_descriptor_past_1023() -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        high = os.dup2(ours.fileno(), 1500)
        try:
            theirs.sendall(b"y")
            assert readable(high)
            assert writable(high)
        finally:
            os.close(high)
