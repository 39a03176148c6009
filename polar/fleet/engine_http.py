"""The proxy's HTTP/1.1 client for model calls to its engines: keep-alive connections, one request on each at a
time, a JSON body out and a whole answer in.

Why not urllib3: a small call's request cost 0.38-0.50 ms of CPU here through urllib3 (most of it ``http.client``
and the ``email`` package parsing the answer's headers), 0.07-0.09 ms through this (``bench/engine_client.py``).
Engines are the proxy's own backends, so only what they send is read: a status line, headers, and a body framed by
``Content-Length``, chunked, or the connection's end.

Failures are told apart the way the engine pool needs them (``polar.fleet.engines``): ``Unreachable`` (no
connection: nothing was sent), ``Dropped`` (the connection ended or broke before a whole answer came: the engine
died or restarted), ``TimedOut`` (no byte of the answer for the read timeout: the engine may be working). A
kept-alive connection the engine closed while it idled is noticed before it is reused, and a request whose reused
connection ends before any answer byte is sent once more on a new one: the engine closed it as the request went out.
"""

from __future__ import annotations

import base64
import socket
import ssl
import threading
from collections import deque
from dataclasses import dataclass
from io import BufferedReader
from urllib.parse import unquote, urlsplit

from polar.codec.sockets import readable

MAX_LINE = 64 * 1024  # a status or header line longer than this is no engine's
MAX_HEADERS = 200


class TransportFailure(Exception):
    """The request got no whole answer."""


class Unreachable(TransportFailure):
    """No connection could be made: the request never left."""


class Dropped(TransportFailure):
    """The connection ended, or the answer was malformed, before a whole answer was read."""


class TimedOut(TransportFailure):
    """The answer's next bytes did not come within the read timeout."""


@dataclass(frozen=True)
class Origin:
    """Where requests to one engine go: its scheme, host and port, the path its URL starts with, and the headers
    every request to it carries (``Host``, and HTTP Basic auth from credentials in its URL)."""

    scheme: str
    host: str
    port: int
    prefix: str
    headers: bytes

    @classmethod
    def of(cls, url: str) -> Origin:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {parts.scheme}://…")
        default = 443 if parts.scheme == "https" else 80
        port = parts.port or default
        host_header = parts.hostname if port == default else f"{parts.hostname}:{port}"
        headers = f"Host: {host_header}\r\nContent-Type: application/json\r\nAccept-Encoding: identity\r\n"
        if parts.username is not None:
            user_info = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
            headers += f"Authorization: Basic {base64.b64encode(user_info.encode()).decode()}\r\n"
        prefix = parts.path.rstrip("/") + (f"?{parts.query}" if parts.query else "")
        return cls(parts.scheme, parts.hostname, port, prefix, headers.encode("latin-1"))


class _Connection:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.reader: BufferedReader = sock.makefile("rb")

    def close(self) -> None:
        for closing in (self.reader, self.sock):
            try:
                closing.close()
            except OSError:
                pass

    def idle_and_open(self) -> bool:
        """An idle kept-alive connection is readable only if the engine closed it (or sent what nobody asked)."""
        try:
            return not readable(self.sock)
        except (OSError, ValueError):
            return False


class EngineHttp:
    """Keep-alive connections to engines, at most ``max_idle`` kept idle per engine."""

    def __init__(self, connect_timeout_s: float, read_timeout_s: float, max_idle: int = 256) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.max_idle = max_idle
        self._idle: dict[Origin, deque[_Connection]] = {}
        self._lock = threading.Lock()
        self._tls: ssl.SSLContext | None = None

    def request(
        self, origin: Origin, method: str, path: str, body: bytes | None = None, timeout_s: float | None = None
    ) -> tuple[int, bytes]:
        """The answer's status and whole body; raises a ``TransportFailure`` when there is none."""
        head = f"{method} {origin.prefix}{path} HTTP/1.1\r\n".encode("latin-1") + origin.headers
        payload = head + b"Content-Length: %d\r\n\r\n" % len(body or b"") + (body or b"")
        timeout = self.read_timeout_s if timeout_s is None else timeout_s
        connection = self._kept(origin)
        if connection is not None:
            try:
                return self._exchange(origin, connection, payload, method, timeout)
            except _EndedBeforeAnswer:
                pass  # closed by the engine as the request went out: once more, on a new connection
        try:
            return self._exchange(origin, self._connect(origin), payload, method, timeout)
        except _EndedBeforeAnswer as exc:
            raise Dropped("the engine closed the connection before answering") from exc

    def close(self) -> None:
        with self._lock:
            kept, self._idle = self._idle, {}
        for connections in kept.values():
            for connection in connections:
                connection.close()

    def _kept(self, origin: Origin) -> _Connection | None:
        while True:
            with self._lock:
                connections = self._idle.get(origin)
                connection = connections.pop() if connections else None
            if connection is None or connection.idle_and_open():
                return connection
            connection.close()

    def _connect(self, origin: Origin) -> _Connection:
        try:
            sock = socket.create_connection((origin.host, origin.port), timeout=self.connect_timeout_s)
        except OSError as exc:  # refused, unroutable, or no answer to connect in time: nothing was sent
            raise Unreachable(f"{type(exc).__name__}: {exc.strerror or exc}") from exc
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if origin.scheme == "https":
            if self._tls is None:
                self._tls = ssl.create_default_context()
            try:
                sock = self._tls.wrap_socket(sock, server_hostname=origin.host)
            except (OSError, ssl.SSLError) as exc:
                sock.close()
                raise Unreachable(f"TLS with {origin.host}: {exc}") from exc
        return _Connection(sock)

    def _exchange(
        self, origin: Origin, connection: _Connection, payload: bytes, method: str, timeout: float
    ) -> tuple[int, bytes]:
        keep = False
        try:
            connection.sock.settimeout(timeout)
            try:
                connection.sock.sendall(payload)
            except (BrokenPipeError, ConnectionResetError) as exc:
                raise _EndedBeforeAnswer() from exc
            status, body, keep = _read_answer(connection.reader, method)
            return status, body
        except TimeoutError as exc:
            raise TimedOut("the engine did not answer in time") from exc
        except OSError as exc:
            raise Dropped(f"{type(exc).__name__}: {exc}") from exc
        finally:
            if keep:
                self._keep(origin, connection)
            else:
                connection.close()

    def _keep(self, origin: Origin, connection: _Connection) -> None:
        with self._lock:
            connections = self._idle.setdefault(origin, deque())
            if len(connections) < self.max_idle:
                connections.append(connection)
                return
        connection.close()


class _EndedBeforeAnswer(Exception):
    """The connection ended before the answer's first byte."""


def _line(reader: BufferedReader) -> bytes:
    line = reader.readline(MAX_LINE + 1)
    if len(line) > MAX_LINE:
        raise Dropped("a line of the answer is too long")
    return line


def _read_answer(reader: BufferedReader, method: str) -> tuple[int, bytes, bool]:
    """Status, body, and whether the connection may carry another request."""
    try:
        first = _line(reader)
    except ConnectionResetError as exc:
        raise _EndedBeforeAnswer() from exc
    if not first:
        raise _EndedBeforeAnswer()
    while True:
        version, status = _status_line(first)
        length, chunked, close = _headers(reader)
        if not 100 <= status < 200 or status == 101:
            break
        first = _line(reader)  # an interim answer (100 Continue): the real one follows
        if not first:
            raise Dropped("the connection ended after an interim answer")
    keep = version == b"HTTP/1.1" and not close
    if method == "HEAD" or status in (204, 304):
        return status, b"", keep
    if chunked:
        return status, _chunked(reader), keep
    if length is not None:
        body = reader.read(length)
        if len(body) != length:
            raise Dropped(f"the answer ended after {len(body)} of {length} bytes")
        return status, body, keep
    return status, reader.read(), False  # framed by the connection's end


def _status_line(line: bytes) -> tuple[bytes, int]:
    version, _, rest = line.partition(b" ")
    code = rest[:3]
    if not version.startswith(b"HTTP/1.") or not code.isdigit():
        raise Dropped(f"not an HTTP/1 answer: {line[:80]!r}")
    return version, int(code)


def _headers(reader: BufferedReader) -> tuple[int | None, bool, bool]:
    """Content-Length (None if absent), whether the body is chunked, and whether the engine closes after it."""
    length: int | None = None
    chunked = close = False
    for _ in range(MAX_HEADERS):
        line = _line(reader)
        if line in (b"\r\n", b"\n"):
            return length, chunked, close
        if not line:
            raise Dropped("the connection ended inside the answer's headers")
        name, _, value = line.partition(b":")
        name, value = name.strip().lower(), value.strip().lower()
        if name == b"content-length":
            if not value.isdigit():
                raise Dropped(f"bad Content-Length: {value[:40]!r}")
            length = int(value)
        elif name == b"transfer-encoding":
            chunked = value.endswith(b"chunked")
        elif name == b"connection":
            close = b"close" in value
    raise Dropped("too many headers in the answer")


def _chunked(reader: BufferedReader) -> bytes:
    parts: list[bytes] = []
    while True:
        size_line = _line(reader).split(b";", 1)[0].strip()
        try:
            size = int(size_line, 16)
        except ValueError as exc:
            raise Dropped(f"bad chunk size: {size_line[:40]!r}") from exc
        if size == 0:
            while _line(reader) not in (b"\r\n", b"\n", b""):  # trailers
                pass
            return b"".join(parts)
        chunk = reader.read(size)
        if len(chunk) != size:
            raise Dropped("the answer ended inside a chunk")
        parts.append(chunk)
        _line(reader)  # the chunk's CRLF
