"""A gunicorn worker for the proxy: ``gunicorn -k web.gunicorn_worker.EpollWorker --threads N …``.

Like gunicorn's ``gthread`` worker it waits on kept-alive connections in one loop and serves each request on a pool
thread, so thousands of idle connections cost no thread. It does less per request, which is what a model call's
proxy CPU is made of (docs/benchmarks.md): gthread hands a request through a futures executor and a wake-up pipe,
unregisters and re-registers the connection with its poller, and parses with gunicorn's general HTTP machinery
(HTTP/2 negotiation, proxy protocol, header maps). Here a connection is armed one-shot in epoll; the main loop
reads a readable one's request head into its reader (llhttp, ``polar.codec.http_requests``), and once a head is
whole (or refused) puts the connection on a queue; a pool thread answers it (``web.http1``), answers any request
pipelined behind it, and re-arms it itself: one system call. So a slow or trickled head holds no thread: a head
must be whole within ``head_s`` (``POLAR_HTTP_HEAD_S``, default 10) of its first byte (a new connection's within
``first_request_s`` of its connect as well), else the connection gets 408 and is closed. Each peer address may
hold at most ``peer_connections`` connections (``POLAR_PEER_CONNECTIONS``); one more is closed at once. Linux only
(epoll); elsewhere use ``-k gthread``.

What it keeps of gunicorn: the master (workers restarted, signals, graceful reloads, ``web/gunicorn_conf.py``'s
metrics hooks), ``--threads``, ``--keep-alive``, ``--worker-connections``, ``--max-requests``,
``--graceful-timeout`` and the heartbeat (``--keep-alive`` is the wait between requests; a new connection has
``first_request_s`` for its first). What it leaves out: TLS, HTTP/2, the access log and the
``pre_request``/``post_request`` hooks (it refuses to start with TLS, and says so if the others are set).
"""

from __future__ import annotations

import errno
import os
import queue
import select
import socket
import threading
import time
from collections import Counter, deque
from typing import Any

from gunicorn.workers import base

from polar.codec.http_requests import MAX_HEAD, RequestReader
from polar.protocols import refusal_answer
from web import http1

_ONESHOT = select.EPOLLIN | select.EPOLLRDHUP | select.EPOLLONESHOT if hasattr(select, "epoll") else 0
# A stopping worker serves requests already arriving on kept-alive connections (answered with Connection: close)
# for this long, then closes the idle ones.
_STOP_LINGER_S = 2.0
_TIMEOUT_ANSWER = refusal_answer(408, "the request head was not sent in time", "", [])


class _Connection:
    __slots__ = ("client", "fresh", "head_until", "idle_until", "pending", "reader", "server", "sock")

    def __init__(self, sock: socket.socket, client: tuple[str, str], server: tuple[str, str]) -> None:
        self.sock = sock
        self.client = client
        self.server = server
        self.reader = RequestReader()  # the connection's requests, as far as their bytes have been parsed
        self.pending = b""  # bytes the loop read that no pool thread has parsed yet (a head, or part of one)
        self.idle_until = 0.0  # 0: a thread is serving it
        self.head_until = 0.0  # when a head has begun to arrive: the deadline for the rest of it
        self.fresh = True  # no request answered yet: first_request_s bounds its first head too


def _address(address: Any) -> tuple[str, str]:
    if isinstance(address, tuple):
        return str(address[0]), str(address[1])
    return "", ""  # a unix socket's peer has no address


class EpollWorker(base.Worker):
    # How long a new connection may take to send its first request. Not ``--keep-alive`` (2 s by default), which
    # is for the wait between requests: a client on a loaded machine can take longer than that between its
    # connect and its first byte, and a connection closed then reads to it as a server gone without an answer.
    first_request_s = http1.IO_TIMEOUT_S
    peer_connections = int(os.environ.get("POLAR_PEER_CONNECTIONS", "512"))
    head_s = float(os.environ.get("POLAR_HTTP_HEAD_S", str(http1.HEAD_S)))  # a head's time from its first byte

    @classmethod
    def check_config(cls, cfg: Any, log: Any) -> None:
        if not hasattr(select, "epoll"):
            raise RuntimeError("web.gunicorn_worker.EpollWorker needs Linux's epoll; use -k gthread here")
        if cfg.is_ssl:
            raise RuntimeError("web.gunicorn_worker.EpollWorker serves plain HTTP; terminate TLS in front of it")
        if cfg.accesslog:
            log.warning("EpollWorker writes no access log; --access-logfile is ignored")

    def init_process(self) -> None:
        self._epoll = select.epoll()
        self._jobs: queue.SimpleQueue[_Connection | None] = queue.SimpleQueue()
        self._connections: dict[int, _Connection] = {}
        # Connections waiting for a request, each queue in deadline order (one wait each: a queue holding both
        # would keep a keep-alive deadline behind a later first-request one); stale entries are skipped.
        self._idle: deque[tuple[float, _Connection]] = deque()  # between requests, for --keep-alive
        self._new: deque[tuple[float, _Connection]] = deque()  # before the first, for first_request_s
        self._heads: deque[tuple[float, _Connection]] = deque()  # a head begun, for http1.HEAD_S
        self._peers: Counter[str] = Counter()  # open connections per peer address
        self._listeners = {listener.fileno(): listener for listener in self.sockets}
        self._addresses = {fd: _address(listener.getsockname()) for fd, listener in self._listeners.items()}
        self._accepting = False
        self._beat_at = 0.0
        self._linger_until = 0.0
        super().init_process()  # loads the app, then calls run()

    def run(self) -> None:
        threads = [threading.Thread(target=self._serve_jobs, name=f"http-{i}", daemon=True)
                   for i in range(self.cfg.threads)]  # fmt: skip
        for thread in threads:
            thread.start()
        while self.alive:
            self._beat()
            self._set_accepting(len(self._connections) < self.cfg.worker_connections)
            self._dispatch(1.0)
            self._close_idle(time.monotonic())
            if self.ppid != os.getppid():
                self.log.info("Parent changed, shutting down: %s", self)
                break
        self._stop(threads)

    def _stop(self, threads: list[threading.Thread]) -> None:
        """Stops accepting; serves what is in flight (and requests arriving on kept-alive connections for a
        moment) until the graceful timeout, then closes every connection."""
        self._set_accepting(False)
        now = time.monotonic()
        self._linger_until = now + _STOP_LINGER_S
        deadline = now + self.cfg.graceful_timeout
        while self._connections and time.monotonic() < deadline:
            self._beat()
            self._dispatch(0.2)
            if time.monotonic() < self._linger_until:
                self._close_idle(time.monotonic())
                continue
            for connection in list(self._connections.values()):
                if connection.idle_until:
                    self._close(connection)
        for connection in list(self._connections.values()):
            self._close(connection)
        for _ in threads:
            self._jobs.put(None)
        self._epoll.close()
        for listener in self.sockets:
            listener.close()

    def _beat(self) -> None:
        now = time.monotonic()
        if now - self._beat_at >= 1.0:  # the heartbeat is a file chmod: once a second is plenty
            self._beat_at = now
            self.notify()

    def _set_accepting(self, accepting: bool) -> None:
        if accepting == self._accepting:
            return
        for fd, listener in self._listeners.items():
            if accepting:
                listener.setblocking(False)
                self._epoll.register(fd, select.EPOLLIN)
            else:
                self._epoll.unregister(fd)
        self._accepting = accepting

    def _dispatch(self, timeout: float) -> None:
        for fd, _ in self._epoll.poll(timeout):
            listener = self._listeners.get(fd)
            if listener is not None:
                self._accept(listener, self._addresses[fd])
                continue
            connection = self._connections.get(fd)
            if connection is not None and connection.idle_until:
                self._read_head(connection)

    def _read_head(self, connection: _Connection) -> None:
        """Reads what has come of a resting connection's next request. Bytes that end a head (a blank line, by
        CRLF or by bare LF, which the parser will refuse), or more than a head may hold, go to a pool thread, which
        parses them; part of a head waits here for the rest, until its deadline, holding no thread. The loop only
        looks for the blank line, so that it takes the GIL the pool threads need for as little as it can (with the
        parse here, the proxy's CPU a call at 64 calls in flight measured 6-8 % above the old worker's, pairwise
        medians of a measure that varies 15 % run to run on 2 cores)."""
        try:
            data = connection.sock.recv(65536, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            self._rearm(connection)
            return
        except OSError:
            self._close(connection)
            return
        if not data:
            self._close(connection)
            return
        searched = max(0, len(connection.pending) - 2)
        # Most heads come whole in one read: the bytes are kept as they came, copied only for a head in parts.
        pending = connection.pending = connection.pending + data if connection.pending else data
        ended = pending.find(b"\n\r\n", searched) >= 0 or pending.find(b"\n\n", searched) >= 0
        if not (ended or connection.reader.partial or len(pending) > MAX_HEAD):
            if not connection.head_until:
                connection.head_until = time.monotonic() + self.head_s
            self._rest(connection, head=True)
            return
        connection.idle_until = 0.0
        self._jobs.put(connection)

    def _accept(self, listener: socket.socket, server: tuple[str, str]) -> None:
        while len(self._connections) < self.cfg.worker_connections:
            try:
                sock, address = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in (errno.ECONNABORTED, errno.EPROTO):
                    continue
                if exc.errno in (errno.EMFILE, errno.ENFILE):  # out of descriptors: let the others finish first
                    self.log.warning("accept: %s; %d connections open", exc, len(self._connections))
                    return
                raise
            client = _address(address)
            if client[0] and self._peers[client[0]] >= self.peer_connections:
                sock.close()  # this peer holds its share of the worker's connections already
                continue
            if sock.family in (socket.AF_INET, socket.AF_INET6):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            http1.set_io_timeout(sock)
            connection = _Connection(sock, client, server)
            self._connections[sock.fileno()] = connection
            if client[0]:
                self._peers[client[0]] += 1
            self._rest(connection, new=True)  # the request may not have arrived yet: wait for it without a thread

    def _rest(self, connection: _Connection, new: bool = False, head: bool = False) -> None:
        """Hands a connection back to the loop until its next request: a ``new`` one for ``first_request_s``, one
        between requests for the keep-alive timeout, one whose ``head`` has begun until the head's deadline (and
        a new one's first-request deadline, whichever comes first)."""
        if head:
            until, waiting = connection.head_until, self._heads
            if connection.fresh and connection.idle_until:  # a new connection's first-request deadline holds too
                until = min(until, connection.idle_until)
        elif new:
            until, waiting = time.monotonic() + max(self.cfg.keepalive, self.first_request_s), self._new
        else:
            until, waiting = time.monotonic() + self.cfg.keepalive, self._idle
        if not self.alive:
            until = min(until, self._linger_until)
        if connection.idle_until != until:
            connection.idle_until = until
            waiting.append((until, connection))
        self._rearm(connection)

    def _rearm(self, connection: _Connection) -> None:
        fd = connection.sock.fileno()
        try:
            self._epoll.modify(fd, _ONESHOT)
        except FileNotFoundError:
            self._epoll.register(fd, _ONESHOT)

    def _close_idle(self, now: float) -> None:
        for waiting in (self._idle, self._new, self._heads):
            while waiting and waiting[0][0] <= now:
                until, connection = waiting.popleft()
                if connection.idle_until == until:  # else it has been served (and maybe rested) since
                    if connection.pending or connection.reader.partial:  # a head that did not come whole in time
                        try:
                            connection.sock.send(_TIMEOUT_ANSWER, socket.MSG_DONTWAIT)
                        except OSError:
                            pass
                    self._close(connection)

    def _close(self, connection: _Connection) -> None:
        if self._connections.pop(connection.sock.fileno(), None) is not None:
            peer = connection.client[0]
            if peer:
                self._peers[peer] -= 1
                if self._peers[peer] <= 0:
                    del self._peers[peer]
            try:
                connection.sock.close()
            except OSError:
                pass

    def _serve_jobs(self) -> None:
        while (connection := self._jobs.get()) is not None:
            try:
                keep = self._serve(connection)
            except Exception:  # a bug here must not cost the thread
                self.log.exception("serving a connection")
                keep = False
            if keep:
                self._rest(connection, head=connection.reader.partial)
            else:
                self._close(connection)

    def _serve(self, connection: _Connection) -> bool:
        """Parses what the loop read, and answers the requests whose heads have arrived on ``connection``; whether
        it stays open (a request whose head is not whole yet is left to the loop, within the head's deadline)."""
        reader = connection.reader
        if connection.pending:
            reader.feed(connection.pending)
            connection.pending = b""
        while True:
            if reader.refused is None and not reader.has_message:
                if not reader.partial:
                    connection.head_until = 0.0
                elif not connection.head_until:
                    connection.head_until = time.monotonic() + self.head_s
                return self.alive or time.monotonic() < self._linger_until
            connection.head_until = 0.0
            keep = self._serve_one(connection)
            if self.nr >= self.max_requests and self.alive:
                self.log.info("Autorestarting worker after current request.")
                self.alive = False
            if not keep:
                return False

    def _serve_one(self, connection: _Connection) -> bool:
        sock, reader = connection.sock, connection.reader
        answer = None
        try:
            message = reader.next_message()
            if message is None:  # not reached: a connection is served once a head is whole or refused
                return True
            self.nr += 1  # --max-requests counts requests, not connections that closed between them
            request = message.head
            connection.fresh = False
            body = http1.Body(sock, reader, message)
            environ = http1.environ_for(request, body, sock, connection.server, connection.client,
                                        self.cfg.workers > 1)  # fmt: skip
            answer = http1.Answer(sock, request, request.keep_alive and self.alive)
            http1.run_app(self.wsgi, environ, answer)
            keep = answer.keep_alive and (body.done or body.drain())
            reader.done_with(message)
            return keep
        except http1.BadRequest as exc:
            if answer is None or not answer.sent_head:  # else it has its answer: one request, one answer
                http1.error_answer(sock, exc.status, exc.reason, exc.head, reader.url_so_far)
        except (http1.ClientGone, BrokenPipeError, ConnectionResetError, BlockingIOError):
            pass  # the client went away or stalled: nothing to answer
        except Exception:
            self.log.exception("Error handling request")
            if answer is None or not answer.sent_head:
                http1.error_answer(sock, 500, "Internal Server Error")
        return False
