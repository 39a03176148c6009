"""Whether an answer reached its client. A call is captured before its answer is sent (so none is lost); when the
client is gone by then (it timed out, or its harness was killed at the budget, whose sockets the kernel closed),
or a stream is cut before its end, the call is marked undelivered and trajectories leave it out."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from typing import Any

from polar.codec.sockets import readable


def client_gone(environ: dict[str, Any]) -> bool:
    """True when the client closed (or reset) its connection: it is readable and a peek reads end-of-file. A
    pipelined next request reads as data, not as gone. False when the server does not expose its socket."""
    sock = environ.get("gunicorn.socket")
    if not isinstance(sock, socket.socket):
        return False
    try:
        return readable(sock) and sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:  # reset by peer
        return True


def watched(stream: Iterator[bytes], on_cut: Callable[[], None]) -> Iterator[bytes]:
    """``stream``, calling ``on_cut`` if it is closed before its last chunk was handed to the server (the server
    closes it when a write to the client fails)."""
    finished = False
    try:
        yield from stream
        finished = True
    finally:
        if not finished:
            on_cut()
