"""Inside a sandbox: the proxy on the sandbox's own loopback, and the harness started behind it.

A ``bwrap`` or ``docker`` sandbox has a network namespace of its own with nothing in it but loopback, so the
harness can reach no host service (Postgres, Redis, the API, the engine). Its one way out is a Unix socket the
host's relay (``polar.runtimes.relay``) listens on, bind-mounted into the sandbox. This program listens on
``127.0.0.1:<port>`` inside, carries each connection to that socket byte for byte, and runs the harness as its
child, exiting with the harness's status:

    python -I forwarder.py --forward 127.0.0.1:8100=/run/polar-proxy/proxy.sock -- claude -p ...

(a second ``--forward 127.0.0.1:3128=/run/polar-proxy/egress.sock`` when the task allows some egress).

It runs by path under ``python -I`` with nothing but the standard library, so it starts fast and imports nothing
the sandbox could have planted on ``sys.path``.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence

CHUNK = 64 * 1024


class Idle:
    """When a spliced connection last carried a byte, either way, and how long it may go without one."""

    def __init__(self, limit_s: float) -> None:
        self.limit_s = limit_s
        self.last = time.monotonic()

    def carried(self) -> None:
        self.last = time.monotonic()

    def left(self) -> float:
        return self.last + self.limit_s - time.monotonic()


def _readable(source: socket.socket, idle: Idle) -> bool:
    """Wait until ``source`` has bytes (or its end) to read: False once the connection has been idle too long,
    either way (the other direction's bytes push the limit on while this one waits)."""
    poller = select.poll()
    poller.register(source, select.POLLIN)
    while (left := idle.left()) > 0:
        if poller.poll(math.ceil(left * 1000)):
            return True
    return False


def _end_both(source: socket.socket, sink: socket.socket) -> None:
    """Shut both sides down, which wakes the other direction's thread from its read or write."""
    for sock in (source, sink):
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


def pump(source: socket.socket, sink: socket.socket, idle: Idle | None = None) -> None:
    """Copy ``source`` to ``sink`` until ``source`` ends, then end ``sink``'s sending side (half-close, so
    a request body's end reaches the other side while the answer still flows back). With ``idle``, both sides
    end once no byte has moved either way for ``idle.limit_s``, or a write stalls that long."""
    buffer = bytearray(CHUNK)
    view = memoryview(buffer)
    try:
        while True:
            if idle is not None and not _readable(source, idle):
                _end_both(source, sink)
                break
            received = source.recv_into(buffer)
            if not received:
                break
            if idle is not None:
                idle.carried()
            sink.sendall(view[:received])
    except TimeoutError:  # a write stalled for the idle limit (the sockets' timeout): the tunnel is stuck
        _end_both(source, sink)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)


def splice(client: socket.socket, upstream: socket.socket, idle_s: float | None = None) -> None:
    """Carry one connection both ways until both sides have ended; close both. With ``idle_s``, both end once
    no byte has moved either way for that long."""
    idle = None
    if idle_s is not None:
        idle = Idle(idle_s)
        for sock in (client, upstream):
            sock.settimeout(idle_s)  # bounds a write to a peer that stopped reading; reads wait in ``_readable``
    back = threading.Thread(target=pump, args=(upstream, client, idle), daemon=True)
    back.start()
    pump(client, upstream, idle)
    back.join()
    client.close()
    upstream.close()


def serve_with(listener: socket.socket, handle: Callable[[socket.socket], None]) -> None:
    """Accept on ``listener`` until it is closed; ``handle`` each connection on a thread of its own."""
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            return  # closed: the relay or forwarder is shutting down
        try:
            threading.Thread(target=handle, args=(client,), daemon=True).start()
        except RuntimeError:  # no thread to be had: this connection fails, the accept loop goes on
            client.close()


def serve(listener: socket.socket, connect: Callable[[], socket.socket]) -> None:
    """Accept on ``listener`` until it is closed; splice each connection to a fresh ``connect()``."""

    def carry(client: socket.socket) -> None:
        try:
            upstream = connect()
        except OSError:
            client.close()  # the harness sees a reset connection, as it would with the proxy down
            return
        splice(client, upstream)

    serve_with(listener, carry)


def _unix(path: str) -> Callable[[], socket.socket]:
    def connect() -> socket.socket:
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            upstream.connect(path)
        except OSError:
            upstream.close()
            raise
        return upstream

    return connect


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--forward", action="append", required=True, metavar="HOST:PORT=SOCKET",
        help="listen on HOST:PORT inside; carry each connection to the host relay's Unix SOCKET",
    )  # fmt: skip
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command to run after --")
    listeners = []
    for forward in args.forward:
        address, _, path = forward.partition("=")
        host, _, port = address.rpartition(":")
        listener = socket.create_server((host, int(port)), backlog=128)
        threading.Thread(target=serve, args=(listener, _unix(path)), daemon=True).start()
        listeners.append(listener)
    try:
        child = subprocess.Popen(command)
    except OSError as exc:
        print(f"polar forwarder: cannot start {command[0]!r}: {exc}", file=sys.stderr)
        return 127
    # A polite stop of the forwarder is a polite stop of the harness.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda number, _frame: child.send_signal(number))
    code = child.wait()
    for listener in listeners:
        listener.close()
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main())
