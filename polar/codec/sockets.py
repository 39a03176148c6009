"""Asking a socket whether it can be read or written, with ``poll``: ``select`` refuses descriptors past 1,023, and a
busy proxy process holds more (its clients' connections, its engine and database connections)."""

from __future__ import annotations

import select
import socket


def readable(sock: socket.socket | int, timeout_s: float | None = 0.0) -> bool:
    """Whether ``sock`` has bytes to read, or its peer ended or broke it, within ``timeout_s`` (None: waits until
    it has)."""
    return _ready(sock, select.POLLIN, timeout_s)


def writable(sock: socket.socket | int, timeout_s: float | None = 0.0) -> bool:
    """Whether ``sock`` takes more bytes (or is broken: the write says how) within ``timeout_s`` (None: waits)."""
    return _ready(sock, select.POLLOUT, timeout_s)


def _ready(sock: socket.socket | int, events: int, timeout_s: float | None) -> bool:
    poller = select.poll()
    poller.register(sock, events)  # POLLHUP and POLLERR come whatever is asked
    return bool(poller.poll(None if timeout_s is None else timeout_s * 1000))
