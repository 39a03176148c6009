"""On the host: what one sandbox may hold open through its sockets, and the accept loop that holds it to that.

A sandbox's harness is written by the policy being rewarded, and its proxy and egress sockets lead into the run
worker (shared by every session it runs) and on to the shared proxy. So each socket serves at most
``connections`` connections at once; one more is answered 503 and closed at once, on the accepting thread, costing
no thread and no upstream connection. A served connection costs at most two threads (one reading the sandbox, one
carrying answers back), so a sandbox costs the run worker at most ``2 + 4 * connections`` threads (both sockets'
accept loops and connections) however many it opens. Every request to the proxy must be sent whole (head and
body) within ``request_send_s`` of its first byte (of the connection, for the first), and at most
``request_bytes`` long (``polar.runtimes.relay``); an egress CONNECT's head within ``request_send_s`` too, and an
egress tunnel that carries no byte either way for ``tunnel_idle_s`` is closed (``polar.runtimes.egress``).
No thread a sandbox's socket started outlives the socket: it keeps its connections (both ends) in ``Served``, and
its end shuts every one of them down, which wakes each thread from its read or write, and joins them, bounded.

Deployment defaults: ``POLAR_SANDBOX_MAX_CONNECTIONS`` (24), ``POLAR_SANDBOX_REQUEST_SEND_S`` (30),
``POLAR_SANDBOX_TUNNEL_IDLE_S`` (300) and ``POLAR_MAX_BODY_BYTES`` (32 MiB); per task, ``runtime.limits``'
``connections``, ``request_send_s`` and ``tunnel_idle_s``.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from polar.config import Config
from polar.contract.task_request import Limits

log = logging.getLogger(__name__)

HEAD_BYTES = 64 * 1024  # a request head (its line and headers) past this is refused
# Seconds an egress tunnel may carry no byte either way before both its ends are closed: long enough for a slow
# server's pause, short enough that a tunnel left open does not hold its two threads and slot for the session.
TUNNEL_IDLE_S = 300.0
BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: close\r\n"
    b"Retry-After: 1\r\nContent-Length: %d\r\n\r\n%s"
)


@dataclass(frozen=True)
class SandboxBounds:
    """What one sandbox may hold through each of its sockets."""

    connections: int = 24
    request_send_s: float = 30.0
    request_bytes: int = 32 * 1024 * 1024
    head_bytes: int = HEAD_BYTES
    tunnel_idle_s: float = TUNNEL_IDLE_S

    @classmethod
    def of_task(cls, config: Config, limits: Limits | None = None) -> SandboxBounds:
        """The task's own ``runtime.limits`` where set, else the deployment's."""
        return cls(
            connections=(limits.connections if limits else None) or config.sandbox_max_connections,
            request_send_s=(limits.request_send_s if limits else None) or config.sandbox_request_send_s,
            request_bytes=config.max_body_bytes,
            tunnel_idle_s=(limits.tunnel_idle_s if limits else None) or config.sandbox_tunnel_idle_s,
        )

    def threads(self) -> int:
        """The most threads one socket of a sandbox costs its run worker: the accept loop, two per connection."""
        return 1 + 2 * self.connections


class Slots:
    """A count of connections held, refusing past ``limit`` (never waits: an accept loop must not block)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self._lock = threading.Lock()

    def take(self) -> bool:
        with self._lock:
            if self.held >= self.limit:
                return False
            self.held += 1
            return True

    def give(self) -> None:
        with self._lock:
            self.held -= 1


# How long the end of a socket waits, in all, for its connections' threads once their sockets are shut down (each
# wakes at once from its read or write; this bounds a stuck one, which is left to end on its own).
END_JOIN_S = 5.0


class Served:
    """The connections one sandbox socket is serving, sandbox side and upstream, and the threads serving them.

    ``end`` shuts every one of them down and joins the threads (within ``join_s`` in all); from then on ``add``
    refuses, so a connection accepted or opened while the socket ends is closed by its caller instead of held."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._threads: set[threading.Thread] = set()
        self.ended = False

    def add(self, sock: socket.socket | None = None, thread: threading.Thread | None = None) -> bool:
        """Hold ``sock`` and ``thread`` until ``discard``; False (holding nothing) once the socket has ended."""
        with self._lock:
            if self.ended:
                return False
            if sock is not None:
                self._sockets.add(sock)
            if thread is not None:
                self._threads.add(thread)
            return True

    def discard(self, sock: socket.socket | None = None, thread: threading.Thread | None = None) -> None:
        with self._lock:
            self._sockets.discard(sock)  # type: ignore[arg-type]
            self._threads.discard(thread)  # type: ignore[arg-type]

    def threads(self) -> list[threading.Thread]:
        with self._lock:
            return list(self._threads)

    def end(self, join_s: float = END_JOIN_S) -> list[threading.Thread]:
        """Shut down and close every connection held and join their threads; the threads still alive after
        ``join_s`` (none, unless one is stuck outside a socket call)."""
        with self._lock:
            self.ended = True
            sockets, threads = list(self._sockets), list(self._threads)
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        deadline = time.monotonic() + join_s
        for thread in threads:
            if thread is not threading.current_thread():
                with contextlib.suppress(RuntimeError):  # not started yet: it will find its connection shut
                    thread.join(max(0.0, deadline - time.monotonic()))
        for sock in sockets:
            sock.close()
        left = [thread for thread in threads if thread.is_alive()]
        if left:
            log.warning("sandbox socket: %d connection thread(s) still running after its end", len(left))
        return left


def _refuse_busy(client: socket.socket, limit: int) -> None:
    """Tell a connection over the bound why, without waiting on it (it may read nothing), and close it."""
    body = b'{"error":{"message":"this sandbox already holds its %d connections to this socket","type":"overloaded"}}'
    body %= limit
    with contextlib.suppress(OSError):
        client.setblocking(False)
        client.send(BUSY % (len(body), body))
    client.close()


def serve_bounded(
    listener: socket.socket,
    handle: Callable[[socket.socket], None],
    bounds: SandboxBounds,
    served: Served | None = None,
) -> None:
    """Accept on ``listener`` until it is closed; ``handle`` each connection on a thread of its own, at most
    ``bounds.connections`` at once, each held in ``served`` (connection and thread) while it runs, so that
    ``served.end()`` ends them. ``handle`` owns (and closes) its connection."""
    slots = Slots(bounds.connections)
    served = served if served is not None else Served()

    def run(client: socket.socket) -> None:
        try:
            handle(client)
        finally:
            served.discard(client, threading.current_thread())
            slots.give()

    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            return  # closed: the sandbox's run is over
        if not slots.take():
            _refuse_busy(client, bounds.connections)
            continue
        thread = threading.Thread(target=run, args=(client,), daemon=True)
        if not served.add(client, thread):  # the socket is ending: this connection is not served
            slots.give()
            client.close()
            return
        try:
            thread.start()
        except RuntimeError as exc:  # no thread to be had (RLIMIT_NPROC, memory): this connection only fails
            log.warning("sandbox socket: cannot start a thread for a connection (%s)", exc)
            served.discard(client, thread)
            slots.give()
            client.close()
