"""HTTP/1.1 as Polar's gunicorn worker (``web.gunicorn_worker``) serves it: a request head read and parsed into a
WSGI environ (PEP 3333), its body as ``wsgi.input`` (framed by Content-Length or chunked, with ``Expect:
100-continue``), and the application's answer written back framed by its length, chunked, or the connection's end.

It reads what HTTP clients send and refuses the rest with a 4xx before the application sees it: a request line and
header fields in CRLF lines, at most 64 KiB of them; no obsolete line folding; Content-Length and chunked never
both (a smuggled request would hide behind the difference); header names with underscores dropped, as gunicorn
drops them, so ``X_Polar_Agent`` cannot pass for ``X-Polar-Agent``. The socket is blocking, with kernel send and
receive timeouts: a client that stops sending or reading frees its thread after ``IO_TIMEOUT_S``.
"""

from __future__ import annotations

import socket
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from email.utils import formatdate
from http import HTTPStatus
from typing import Any
from urllib.parse import unquote_to_bytes, urlsplit

MAX_HEAD = 64 * 1024
# A kept-alive connection's unread request body is read off before the next request, up to this many bytes;
# a larger one closes the connection instead.
MAX_DRAIN = 1024 * 1024
IO_TIMEOUT_S = 30.0
_RECV = 65536
_HEX = frozenset(b"0123456789abcdefABCDEF")
_TOKEN = frozenset(b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_NO_BODY_STATUSES = (204, 304)
_HOP_BY_HOP = frozenset(("connection", "keep-alive", "transfer-encoding", "upgrade", "te", "trailer"))


class BadRequest(Exception):
    """A request the server refuses before the application sees it (``status``: 400, 431, 501 or 505)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class ClientGone(Exception):
    """The client closed its connection, or stopped sending, before a whole request arrived."""


def set_io_timeout(sock: socket.socket, seconds: float = IO_TIMEOUT_S) -> None:
    """Blocking ``sock`` whose reads and writes give up after ``seconds`` (``SO_RCVTIMEO`` / ``SO_SNDTIMEO``: no
    poll before each call, as Python's own socket timeouts add)."""
    sock.setblocking(True)
    value = int(seconds).to_bytes(8, sys.byteorder) + int((seconds % 1) * 1e6).to_bytes(8, sys.byteorder)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, value)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, value)


def _receiving(receive: Callable[..., Any], *args: Any) -> Any:
    """``receive(*args)`` (a socket's recv or recv_into), its failures as ``ClientGone``."""
    try:
        return receive(*args)
    except BlockingIOError as exc:  # SO_RCVTIMEO ran out
        raise ClientGone("the client stopped sending") from exc
    except (ConnectionResetError, ConnectionAbortedError) as exc:
        raise ClientGone("the client reset its connection") from exc


def _recv(sock: socket.socket, size: int = _RECV) -> bytes:
    data: bytes = _receiving(sock.recv, size)
    return data


def read_head(sock: socket.socket, buffer: bytearray) -> bytes | None:
    """The next request's head (request line and header fields, without the blank line) from ``buffer`` and then
    ``sock``; what follows it stays in ``buffer``. None when the connection ended cleanly between requests."""
    searched = 0
    while True:
        while buffer[:2] == b"\r\n":  # RFC 9112 §2.2: empty lines before a request line are ignored
            del buffer[:2]
        end = buffer.find(b"\r\n\r\n", max(0, searched - 3))
        if end > MAX_HEAD or (end < 0 and len(buffer) > MAX_HEAD):
            raise BadRequest(431, "the request head is over 64 KiB")
        if end >= 0:
            head = bytes(buffer[:end])
            del buffer[: end + 4]
            return head
        searched = len(buffer)
        data = _recv(sock)
        if not data:
            if buffer:
                raise ClientGone("the connection ended inside a request head")
            return None
        buffer += data


class Request:
    """A parsed request head: ``method``, ``target``, ``version``, and its header ``fields`` in order."""

    __slots__ = ("fields", "method", "target", "version")

    def __init__(self, method: str, target: str, version: str, fields: list[tuple[str, str]]) -> None:
        self.method, self.target, self.version, self.fields = method, target, version, fields

    def field(self, name: str) -> str | None:
        """Field ``name`` (lower case), repeated values joined by commas; None when absent."""
        values = [value for key, value in self.fields if key.lower() == name]
        return ", ".join(values) if values else None

    @property
    def keep_alive(self) -> bool:
        """Whether the client asks to keep the connection after this request (HTTP/1.1 unless it says close;
        HTTP/1.0 only when it says keep-alive)."""
        tokens = self.tokens("connection")
        return "close" not in tokens if self.version == "HTTP/1.1" else "keep-alive" in tokens

    def tokens(self, name: str) -> set[str]:
        """The comma-separated tokens of field ``name``, lower case."""
        value = self.field(name)
        return {token.strip().lower() for token in value.split(",")} if value else set()


def parse_head(head: bytes) -> Request:
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not parts[0] or not parts[1]:
        raise BadRequest(400, "malformed request line")
    method, target, version = parts
    if not _TOKEN.issuperset(method):
        raise BadRequest(400, "malformed request method")
    if version not in (b"HTTP/1.1", b"HTTP/1.0"):
        if version.startswith(b"HTTP/"):
            raise BadRequest(505, "only HTTP/1.0 and HTTP/1.1 are served")
        raise BadRequest(400, "malformed request line")
    fields = []
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if line[:1] in (b" ", b"\t"):
            raise BadRequest(400, "obsolete line folding")
        if not colon or not name or not _TOKEN.issuperset(name):
            raise BadRequest(400, "malformed header field")
        value = value.strip(b" \t")
        if b"\r" in value or b"\n" in value or b"\0" in value:
            raise BadRequest(400, "malformed header field value")
        fields.append((name.decode("ascii"), value.decode("latin-1")))
    return Request(method.decode("ascii"), target.decode("latin-1"), version.decode("ascii"), fields)


def body_framing(request: Request) -> tuple[int | None, bool]:
    """(Content-Length, chunked) of ``request``'s body; refuses a request that says both, or neither plainly."""
    encodings = request.tokens("transfer-encoding")
    length_field = request.field("content-length")
    if encodings:
        if length_field is not None:
            raise BadRequest(400, "both Content-Length and Transfer-Encoding")
        if request.version != "HTTP/1.1" or encodings != {"chunked"}:
            raise BadRequest(501, "only the chunked transfer coding is served")
        return None, True
    if length_field is None:
        return 0, False
    lengths = {value.strip() for value in length_field.split(",")}
    length = lengths.pop()
    if lengths or not length.isdigit() or not length.isascii():
        raise BadRequest(400, "malformed Content-Length")
    return int(length), False


class Body:
    """``wsgi.input``: the request's body, read from the connection's buffer and then its socket. A body sent
    after ``Expect: 100-continue`` is asked for (``100 Continue``) when the application first reads it."""

    def __init__(
        self, sock: socket.socket, buffer: bytearray, length: int | None, chunked: bool, expects_continue: bool
    ) -> None:
        self._sock = sock
        self._buffer = buffer
        self._remaining = length or 0  # of the body, or of the current chunk when chunked
        self._chunked = chunked
        self._done = not chunked and not length
        self._continue = expects_continue and not self._done
        self._pending = b""  # read past a line's end by readline

    @property
    def done(self) -> bool:
        """The whole body has been read."""
        return self._done and not self._pending

    def _fill(self) -> None:
        if self._continue:
            self._continue = False
            self._sock.sendall(_CONTINUE)
        data = _recv(self._sock)
        if not data:
            raise ClientGone("the connection ended inside a request body")
        self._buffer += data

    def _line(self, too_long: str) -> bytes:
        """The body's next CRLF-ended line (a chunk size, a trailer), without its CRLF; ``too_long`` refuses one
        longer than a head may be."""
        while (end := self._buffer.find(b"\r\n")) < 0:
            if len(self._buffer) > MAX_HEAD:
                raise BadRequest(400, too_long)
            self._fill()
        line = bytes(self._buffer[:end])
        del self._buffer[: end + 2]
        return line

    def _chunk_size(self) -> None:
        """Reads the next chunk's size line; at the last chunk, the trailers (ignored) up to the blank line."""
        line = self._line("malformed chunk size").partition(b";")[0].strip(b" \t")
        if not line or len(line) > 16 or not _HEX.issuperset(line):
            raise BadRequest(400, "malformed chunk size")
        self._remaining = int(line, 16)
        if self._remaining == 0:
            while self._line("request trailers over 64 KiB"):
                pass
            self._done = True

    def _read_some(self, size: int) -> bytes:
        """Up to ``size`` bytes of the body (at least one unless it has ended)."""
        if self._pending:
            data, self._pending = self._pending[:size], self._pending[size:]
            return data
        while not self._done and self._remaining == 0:  # chunked: between chunks
            self._chunk_size()
        if self._done:
            return b""
        if not self._buffer:
            self._fill()
        count = min(size, self._remaining, len(self._buffer))
        data = bytes(self._buffer[:count])
        del self._buffer[:count]
        self._remaining -= count
        if self._remaining == 0:
            if not self._chunked:
                self._done = True
            else:  # a chunk's data ends with exactly CRLF: anything else is refused at once, not read on for a line
                while len(self._buffer) < 2:
                    self._fill()
                if self._buffer[:2] != b"\r\n":
                    raise BadRequest(400, "malformed chunk")
                del self._buffer[:2]
        return data

    def _read_exactly(self, size: int) -> bytes:
        """A Content-Length body's next ``size`` bytes straight into one buffer: one copy, large reads."""
        out = bytearray(size)
        view = memoryview(out)
        taken = min(size, len(self._buffer))
        view[:taken] = self._buffer[:taken]
        del self._buffer[:taken]
        if taken < size and self._continue:
            self._continue = False
            self._sock.sendall(_CONTINUE)
        while taken < size:
            got = _receiving(self._sock.recv_into, view[taken:], min(size - taken, 1 << 20))
            if got == 0:
                raise ClientGone("the connection ended inside a request body")
            taken += got
        self._remaining -= size
        self._done = self._remaining == 0
        return bytes(out)

    def read(self, size: int | None = -1) -> bytes:
        if size is None or size < 0:
            if not self._chunked and not self._pending and self._remaining:
                return self._read_exactly(self._remaining)
            parts = []
            while data := self._read_some(_RECV):
                parts.append(data)
            return b"".join(parts)
        parts, wanted = [], size
        while wanted > 0 and (data := self._read_some(wanted)):
            parts.append(data)
            wanted -= len(data)
        return b"".join(parts)

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
                self._pending = data[end + 1 :] + self._pending
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
        when that is over ``MAX_DRAIN`` bytes, or the client was never asked for it (close the connection)."""
        if self._continue:
            return False
        drained = 0
        while not self.done:
            if not self._chunked and self._remaining > MAX_DRAIN - drained:
                return False
            data = self._read_some(_RECV)
            drained += len(data)
            if drained > MAX_DRAIN:
                return False
        return True


def environ_for(
    request: Request,
    body: Body,
    sock: socket.socket,
    server: tuple[str, str],
    client: tuple[str, str],
    multiprocess: bool,
) -> dict[str, Any]:
    """The WSGI environ of ``request`` (PEP 3333), with the connection's socket as ``gunicorn.socket``."""
    target = request.target
    if not target.startswith("/") and target != "*":
        if "://" in target:  # absolute form: the path is what counts
            split = urlsplit(target)
            target = (split.path or "/") + ("?" + split.query if split.query else "")
        else:
            raise BadRequest(400, "malformed request target")
    path, _, query = target.partition("?")
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

    def __init__(self, sock: socket.socket, request: Request, keep_alive: bool) -> None:
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


def error_answer(sock: socket.socket, status: int, reason: str) -> None:
    """A plain-text refusal, closing the connection (the request's remaining bytes cannot be trusted)."""
    body = (reason + "\n").encode("utf-8")
    head = (
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\nContent-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n"
    ).encode("latin-1")
    try:
        sock.sendall(head + _date_field() + b"\r\n" + body)
    except OSError:
        pass
