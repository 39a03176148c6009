"""HTTP/1.1 as Polar's gunicorn worker (``web.gunicorn_worker``) serves it: each request parsed by the reader the
sandbox relay also uses (``polar.codec.http_requests``: llhttp and Polar's framing policy, which say what is refused
and why), turned into a WSGI environ (PEP 3333) with its body as ``wsgi.input``, and the application's answer
written back framed by its length, chunked, or the connection's end.

Deadlines: a head must be whole within ``HEAD_S`` of its first byte (the worker's loop reads heads, so a slow one
holds no thread), a body within ``BODY_S`` of its head, and what the application left of a body is read off within
``DRAIN_S`` (at most ``MAX_DRAIN`` bytes) or the connection closes. The socket is blocking, with kernel send and
receive timeouts of ``IO_TIMEOUT_S`` for each read and write. Header names with underscores are dropped, as
gunicorn drops them, so ``X_Polar_Agent`` cannot pass for ``X-Polar-Agent``. A framing error found after the
answer's head went out closes the connection: a client is never sent a second answer to one request.
"""

from __future__ import annotations

import socket
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from email.utils import formatdate
from typing import Any
from urllib.parse import unquote_to_bytes

from polar.codec.http_requests import Message, Refused, RequestHead, RequestReader
from polar.protocols import refusal_answer

# A kept-alive connection's unread request body is read off before the next request, up to this many bytes;
# a larger one closes the connection instead.
MAX_DRAIN = 1024 * 1024
IO_TIMEOUT_S = 30.0
HEAD_S = 10.0
BODY_S = 300.0
DRAIN_S = 5.0
_RECV = 65536
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_NO_BODY_STATUSES = (204, 304)
_HOP_BY_HOP = frozenset(("connection", "keep-alive", "transfer-encoding", "upgrade", "te", "trailer"))


BadRequest = Refused  # what this server refuses before the application sees it (status and reason)


class ClientGone(Exception):
    """The client closed its connection, or stopped sending, before a whole request arrived."""


def set_io_timeout(sock: socket.socket, seconds: float = IO_TIMEOUT_S) -> None:
    """Blocking ``sock`` whose reads and writes give up after ``seconds`` (``SO_RCVTIMEO`` / ``SO_SNDTIMEO``: no
    poll before each call, as Python's own socket timeouts add)."""
    sock.setblocking(True)
    value = int(seconds).to_bytes(8, sys.byteorder) + int((seconds % 1) * 1e6).to_bytes(8, sys.byteorder)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, value)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, value)


def _recv(sock: socket.socket, size: int = _RECV) -> bytes:
    """``sock.recv(size)``, its failures as ``ClientGone``."""
    try:
        return sock.recv(size)
    except BlockingIOError as exc:  # SO_RCVTIMEO ran out
        raise ClientGone("the client stopped sending") from exc
    except (ConnectionResetError, ConnectionAbortedError) as exc:
        raise ClientGone("the client reset its connection") from exc


def next_request(sock: socket.socket, reader: RequestReader) -> Message | None:
    """The connection's next request whose head is complete, reading ``sock`` until one is; None when the
    connection ended cleanly between requests. Raises ``BadRequest`` for a request the parser refused."""
    while (message := reader.next_message()) is None:
        data = _recv(sock)
        if not data:
            if reader.partial:
                raise ClientGone("the connection ended inside a request head")
            return None
        reader.feed(data)
    return message


class Body:
    """``wsgi.input``: one request's body, as the connection's reader (llhttp) delivers it, read from ``sock`` as
    the application asks; the whole of it must arrive within ``BODY_S`` of the head. A body sent after ``Expect:
    100-continue`` is asked for (``100 Continue``) when the application first reads it."""

    def __init__(self, sock: socket.socket, reader: RequestReader, message: Message) -> None:
        self._sock = sock
        self._reader = reader
        self._message = message
        self._pieces = message.pieces
        self._continue = message.head.expects_continue and not message.complete
        self._deadline = time.monotonic() + BODY_S

    @property
    def done(self) -> bool:
        """The whole body has been read."""
        return self._message.complete and not self._pieces

    def _fill(self) -> None:
        self._reader.check(self._message)  # bytes already read may hold its refusal: no wait for more
        if self._continue:
            self._continue = False
            self._sock.sendall(_CONTINUE)
        if time.monotonic() > self._deadline:
            raise ClientGone(f"the request body did not arrive within {BODY_S:.0f} s")
        data = _recv(self._sock)
        if not data:
            raise ClientGone("the connection ended inside a request body")
        self._reader.feed(data)
        self._reader.check(self._message)

    def _read_some(self, size: int) -> bytes:
        """Up to ``size`` bytes of the body (at least one unless it has ended)."""
        pieces = self._pieces
        while not pieces:
            if self._message.complete:
                return b""
            self._fill()
        piece = pieces[0]
        if len(piece) <= size:
            return pieces.popleft()
        pieces[0] = piece[size:]
        return piece[:size]

    def read(self, size: int | None = -1) -> bytes:
        if size is None or size < 0:
            size = sys.maxsize
        parts, wanted = [], size
        while wanted > 0 and (data := self._read_some(wanted)):
            parts.append(data)
            wanted -= len(data)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def readline(self, size: int | None = -1) -> bytes:
        limit = sys.maxsize if size is None or size < 0 else size
        line = b""
        while len(line) < limit:
            data = self._read_some(min(_RECV, limit - len(line)))
            if not data:
                break
            end = data.find(b"\n")
            if end >= 0:
                line += data[: end + 1]
                if end + 1 < len(data):
                    self._pieces.appendleft(data[end + 1 :])
                break
            line += data
        return line

    def readlines(self, hint: int = -1) -> list[bytes]:
        lines, total = [], 0
        while line := self.readline():
            lines.append(line)
            total += len(line)
            if 0 < hint <= total:
                break
        return lines

    def __iter__(self) -> Iterator[bytes]:
        while line := self.readline():
            yield line

    def drain(self) -> bool:
        """Reads off what the application left of the body, so the connection can carry the next request; False
        (close the connection) when that is over ``MAX_DRAIN`` bytes or ``DRAIN_S`` seconds, when the parser
        refuses it, or when the client was never asked for it."""
        if self._continue:
            return False
        content_length = self._message.head.content_length
        if content_length is not None and content_length - self._message.received > MAX_DRAIN:
            return False
        self._pieces.clear()
        self._deadline = min(self._deadline, time.monotonic() + DRAIN_S)
        drained = 0
        try:
            while not self._message.complete:
                self._fill()
                drained += sum(len(piece) for piece in self._pieces)
                self._pieces.clear()
                if drained > MAX_DRAIN:
                    return False
        except (Refused, ClientGone, OSError):
            return False
        return True


def environ_for(
    request: RequestHead,
    body: Body,
    sock: socket.socket,
    server: tuple[str, str],
    client: tuple[str, str],
    multiprocess: bool,
) -> dict[str, Any]:
    """The WSGI environ of ``request`` (PEP 3333), with the connection's socket as ``gunicorn.socket``."""
    path, _, query = request.origin_form.partition("?")  # an absolute-form target: its path is what counts
    environ: dict[str, Any] = {
        "REQUEST_METHOD": request.method,
        "SCRIPT_NAME": "",
        "PATH_INFO": unquote_to_bytes(path).decode("latin-1") if "%" in path else path,
        "QUERY_STRING": query,
        "RAW_URI": request.target,
        "SERVER_PROTOCOL": request.version,
        "SERVER_NAME": server[0],
        "SERVER_PORT": server[1],
        "REMOTE_ADDR": client[0],
        "REMOTE_PORT": client[1],
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": "http",
        "wsgi.input": body,
        "wsgi.input_terminated": True,  # a chunked body ends by itself: read it to its end, not to a length
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": True,
        "wsgi.multiprocess": multiprocess,
        "wsgi.run_once": False,
        "gunicorn.socket": sock,
    }
    for name, value in request.fields:
        if "_" in name:
            continue
        key = name.upper().replace("-", "_")
        if key in ("CONTENT_TYPE", "CONTENT_LENGTH"):
            environ[key] = value
            continue
        key = "HTTP_" + key
        environ[key] = environ[key] + "," + value if key in environ else value
    return environ


_date: tuple[int, bytes] = (0, b"")


def _date_field() -> bytes:
    global _date
    now = int(time.time())
    if _date[0] != now:
        _date = (now, b"Date: " + formatdate(now, usegmt=True).encode("ascii") + b"\r\n")
    return _date[1]


class Answer:
    """The application's answer on one connection: ``start_response`` records it, ``send`` writes the head with
    the body's first bytes in one write, framed by the application's Content-Length, else chunked (HTTP/1.1), else
    by closing the connection. ``keep_alive`` says whether the connection can carry another request."""

    def __init__(self, sock: socket.socket, request: RequestHead, keep_alive: bool) -> None:
        self._sock = sock
        self._head_request = request.method == "HEAD"
        self._version = request.version
        self.keep_alive = keep_alive
        self.status: str | None = None
        self._fields: list[tuple[str, str]] = []
        self._length: int | None = None
        self._chunked = False
        self.sent_head = False
        self._sent = 0

    def start_response(
        self, status: str, headers: list[tuple[str, str]], exc_info: Any = None
    ) -> Callable[[bytes], None]:
        if exc_info is not None:
            if self.sent_head:
                raise exc_info[1].with_traceback(exc_info[2])
        elif self.status is not None:
            raise AssertionError("start_response was already called")
        self.status, self._fields, self._length = status, [], None
        for name, value in headers:
            lower = name.lower()
            if lower in _HOP_BY_HOP:
                if lower == "connection" and value.strip().lower() == "close":
                    self.keep_alive = False
                continue  # framing and the connection are this server's to say
            if "\r" in value or "\n" in value or "\r" in name or "\n" in name:
                raise ValueError(f"header {name!r} holds a line break")
            if lower == "content-length":
                self._length = int(value)
            self._fields.append((name, value))
        return self.send

    def _head(self) -> bytes:
        assert self.status is not None, "the application did not call start_response"
        code = int(self.status[:3])
        no_body = self._head_request or code in _NO_BODY_STATUSES or code < 200
        if self._length is None and not no_body:
            if self._version == "HTTP/1.1":
                self._chunked = True
            else:
                self.keep_alive = False
        lines = [f"{self._version} {self.status}\r\n".encode("latin-1")]
        lines += [f"{name}: {value}\r\n".encode("latin-1") for name, value in self._fields]
        lines.append(_date_field())
        if self._chunked:
            lines.append(b"Transfer-Encoding: chunked\r\n")
        if not self.keep_alive:
            lines.append(b"Connection: close\r\n")
        elif self._version == "HTTP/1.0":
            lines.append(b"Connection: keep-alive\r\n")
        lines.append(b"\r\n")
        self.sent_head = True
        return b"".join(lines)

    def send(self, data: bytes) -> None:
        head = b"" if self.sent_head else self._head()
        if self._head_request:
            data = b""
        elif self._chunked:
            data = b"%x\r\n%b\r\n" % (len(data), data) if data else b""
        else:
            self._sent += len(data)
        if len(data) > 65536 and head:  # a large body is not copied behind its head
            self._sock.sendall(head)
            head = b""
        if head or data:
            self._sock.sendall(head + data if head else data)

    def finish(self) -> None:
        """Ends the body: its last chunk, or a head alone for an empty one; a body shorter than its
        Content-Length leaves the connection unusable."""
        if not self.sent_head:
            self.send(b"")
        if self._chunked:
            self._sock.sendall(b"0\r\n\r\n")
        elif not self._head_request and self._length is not None and self._sent != self._length:
            self.keep_alive = False


def run_app(app: Callable[..., Iterable[bytes]], environ: dict[str, Any], answer: Answer) -> None:
    """Calls the WSGI ``app`` and writes its answer; the iterable is closed whatever happens (a streamed answer
    learns that way that its client went away)."""
    result = app(environ, answer.start_response)
    try:
        for data in result:
            if data:
                answer.send(data)
        answer.finish()
    finally:
        close = getattr(result, "close", None)
        if close is not None:
            close()


def error_answer(sock: socket.socket, status: int, reason: str, head: RequestHead | None = None,
                 path: str = "") -> None:  # fmt: skip
    """Writes a refusal of the request ``head`` (or of one whose head came only as far as ``path``) in the error
    shape of the protocol it names, closing the connection (the request's remaining bytes cannot be trusted)."""
    fields = head.fields if head is not None else []
    try:
        sock.sendall(refusal_answer(status, reason, head.path if head is not None else path, fields))
    except OSError:
        pass
