"""On the host: one sandbox connection carried to the proxy as HTTP/1.1 requests, each held to the sandbox's bounds.

The relay (``polar.runtimes.relay``) reads each request's head itself before anything goes upstream, so:

- the upstream connection opens only once a whole head has arrived: idle connections and slow heads never reach
  the proxy;
- the head is sent upstream with ``Host`` set to the proxy's own (the sandbox's is dropped), so a load balancer in
  front of the proxy cannot be steered to another virtual host;
- every request must be sent whole, head and body, within ``request_send_s`` of its first byte, and be at most
  ``request_bytes`` long (a ``Content-Length`` over it is refused before any of it is read);
- framing the relay cannot follow is refused (both ``Content-Length`` and ``Transfer-Encoding``, a coding other
  than ``chunked``, folded headers, upgrades, ``CONNECT``, a chunk size that is not 1 to 16 hex digits, a
  ``Content-Length`` with more digits than the bound has): what the relay counts is what the proxy reads.

A request refused before any of it went upstream gets its status (400, 408, 413, 502) in the error shape of the
protocol its path names, and the connection is closed. Bodies are streamed, never held whole; answers flow back
byte for byte (keep-alive, streaming) on a second thread.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable

from polar.protocols import protocol_for_errors
from polar.runtimes.bounds import SandboxBounds, Served

CHUNK = 64 * 1024
LINE_BYTES = 4096  # a chunk-size or trailer line
_HEX = frozenset(b"0123456789abcdefABCDEF")
MAX_CHUNK_DIGITS = 16  # the proxy's own limit (web.http1)


class Refusal(Exception):
    """A request the relay will not carry; ``status`` and the message go back to the sandbox when they still can."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class _Reader:
    """A sandbox connection read with a deadline: every read gives up (408) once ``deadline`` has passed."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = bytearray()
        self.deadline: float | None = None

    def _left(self) -> float | None:
        """Seconds left to the deadline (None: none); 408 once it has passed. Checked on every turn of every loop
        that reads, so no loop outlives the deadline, whether or not it reads."""
        if self.deadline is None:
            return None
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise Refusal(408, "the request was not sent within this sandbox's request_send_s")
        return left

    def _fill(self) -> bool:
        """Read more into the buffer; False at the end of the stream."""
        self.sock.settimeout(self._left())
        try:
            data = self.sock.recv(CHUNK)
        except TimeoutError:
            raise Refusal(408, "the request was not sent within this sandbox's request_send_s") from None
        self.buffer += data
        return bool(data)

    def until(self, marker: bytes, limit: int, what: str) -> bytes | None:
        """Bytes up to and including ``marker``; None when the stream ends before any byte."""
        start = 0
        while (found := self.buffer.find(marker, start)) < 0:
            self._left()
            if len(self.buffer) > limit:
                raise Refusal(431 if what == "head" else 400, f"request {what} longer than {limit} bytes")
            start = max(0, len(self.buffer) - len(marker) + 1)
            if not self._fill():
                if self.buffer:
                    raise Refusal(400, f"connection closed in the middle of the request {what}")
                return None
        end = found + len(marker)
        if end > limit:
            raise Refusal(431 if what == "head" else 400, f"request {what} longer than {limit} bytes")
        taken = bytes(self.buffer[:end])
        del self.buffer[:end]
        return taken

    def first_byte(self) -> bool:
        """Wait (without a deadline) for the next request to start; False when the connection ended instead."""
        return bool(self.buffer) or self._fill()

    def exactly(self, count: int, sink: Callable[[bytes], None]) -> None:
        """Hand ``count`` bytes to ``sink`` as they come."""
        if count < 0:  # a Refusal, not an assert: ``python -O`` must not turn this into a loop that never ends
            raise Refusal(400, f"cannot carry a negative number of bytes ({count})")
        while count > 0:
            self._left()
            if not self.buffer and not self._fill():
                raise Refusal(400, "connection closed in the middle of the request body")
            piece = bytes(self.buffer[:count])
            del self.buffer[: len(piece)]
            count -= len(piece)
            sink(piece)


class Head:
    """A parsed request head: the request line and headers as sent, in order."""

    def __init__(self, raw: bytes) -> None:
        lines = raw[:-4].split(b"\r\n")
        try:
            self.method, self.target, self.version = lines[0].decode("ascii").split(" ")
        except (UnicodeDecodeError, ValueError):
            raise Refusal(400, "malformed request line") from None
        if self.version not in ("HTTP/1.1", "HTTP/1.0"):
            raise Refusal(400, "only HTTP/1.0 and HTTP/1.1 are relayed")
        self.headers: list[tuple[str, bytes]] = []
        for line in lines[1:]:
            name, colon, value = line.partition(b":")
            if not colon or not name or line[:1] in (b" ", b"\t") or name != name.strip():
                raise Refusal(400, "malformed header line")
            try:
                self.headers.append((name.decode("ascii").lower(), value.strip()))
            except UnicodeDecodeError:
                raise Refusal(400, "malformed header name") from None

    def values(self, name: str) -> list[bytes]:
        return [value for key, value in self.headers if key == name]

    def path(self) -> str:
        return self.target.split("?", 1)[0]

    def protocol_headers(self) -> dict[str, str]:
        return {name: value.decode("latin-1") for name, value in self.headers}

    def framing(self, bounds: SandboxBounds) -> int | None:
        """The body's ``Content-Length`` (0 when none), or None for a chunked body; refuses what is ambiguous."""
        if self.method == "CONNECT" or self.values("upgrade"):
            raise Refusal(400, "CONNECT and protocol upgrades are not relayed to the proxy")
        codings = b",".join(self.values("transfer-encoding")).replace(b" ", b"").lower()
        lengths = {value for value in self.values("content-length")}
        if codings:
            if lengths:
                raise Refusal(400, "a request may not carry both Content-Length and Transfer-Encoding")
            if codings != b"chunked":
                raise Refusal(501, "only the chunked transfer coding is relayed")
            return None
        if not lengths:
            return 0
        if len(lengths) > 1 or not next(iter(lengths)).isdigit():
            raise Refusal(400, "malformed Content-Length")
        digits = next(iter(lengths))
        if len(digits) > len(str(bounds.request_bytes)):  # never int() of thousands of digits
            raise Refusal(413, f"a Content-Length of {len(digits)} digits is over {bounds.request_bytes} bytes")
        length = int(digits)
        if length > bounds.request_bytes:
            raise Refusal(413, f"request body of {length} bytes is over this deployment's {bounds.request_bytes}")
        return length

    def upstream(self, host: bytes) -> bytes:
        """The head as the proxy gets it: ``Host`` is the proxy's own."""
        lines = [f"{self.method} {self.target} {self.version}".encode(), b"Host: " + host]
        lines += [name.encode() + b": " + value for name, value in self.headers if name != "host"]
        return b"\r\n".join(lines) + b"\r\n\r\n"


def error_response(status: int, message: str, head: Head | None, partial: bytes = b"") -> bytes:
    """``status`` in the error shape of the protocol the request names (by its path and headers; by the path on
    its request line when the head never finished; OpenAI's when nothing tells)."""
    if head is not None:
        path, headers = head.path(), head.protocol_headers()
    else:
        line = partial.split(b"\r\n", 1)[0].split(b" ")
        path, headers = (line[1].decode("latin-1").split("?", 1)[0] if len(line) > 1 else ""), {}
    body = json.dumps(protocol_for_errors(path, headers).render_error(status, message)).encode()
    return (
        b"HTTP/1.1 %d Refused\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s"
        % (status, len(body), body)
    )


class Carry:
    """One sandbox connection, request by request, to a connection ``connect()`` opens once a head has come."""

    def __init__(
        self,
        client: socket.socket,
        connect: Callable[[], socket.socket],
        host: bytes,
        bounds: SandboxBounds,
        served: Served | None = None,
    ) -> None:
        self.client = client
        self.connect = connect
        self.host = host
        self.bounds = bounds
        self.served = served if served is not None else Served()  # holds the upstream and the answers' thread
        self.reader = _Reader(client)
        self.upstream: socket.socket | None = None
        self.back: threading.Thread | None = None
        self.answered = 0  # bytes carried back to the sandbox so far
        self.refusing = False

    def run(self) -> None:
        head: Head | None = None
        sent_at_start = 0
        try:
            # The first request's head must come within request_send_s of the connection; a later one's clock starts
            # at its first byte (until then the proxy's own keep-alive timeout ends an idle connection).
            self.reader.deadline = time.monotonic() + self.bounds.request_send_s
            while True:
                head = None
                if self.upstream is not None:
                    self.reader.deadline = None
                    if not self.reader.first_byte():
                        break
                    self.reader.deadline = time.monotonic() + self.bounds.request_send_s
                raw = self.reader.until(b"\r\n\r\n", self.bounds.head_bytes, "head")
                if raw is None:
                    break
                head = Head(raw)
                length = head.framing(self.bounds)
                sent_at_start = self.answered
                self._open()
                self._send(head.upstream(self.host))
                if length is None:
                    self._chunked()
                else:
                    self.reader.exactly(length, self._send)
            self._end_upstream()
        except Refusal as refusal:
            self._refuse(refusal, head, sent_at_start)
        except OSError:
            pass
        finally:
            self._close()

    def _open(self) -> None:
        if self.upstream is not None:
            return
        try:
            upstream = self.connect()
        except OSError as exc:
            raise Refusal(502, f"the proxy cannot be reached: {exc}") from exc
        back = threading.Thread(target=self._carry_back, daemon=True)
        if not self.served.add(upstream, back):  # the sandbox's socket is ending
            upstream.close()
            raise Refusal(503, "the sandbox's session is ending")
        self.upstream = upstream
        try:
            back.start()
        except RuntimeError:
            self.served.discard(thread=back)
            raise Refusal(503, "the run worker has no thread for this connection") from None
        self.back = back

    def _carry_back(self) -> None:
        """The proxy's answers, byte for byte, until it ends the connection (keep-alive timeout, an error) or the
        reader stops it; then the sandbox's side ends too (which also wakes a reader waiting for a next request),
        unless the reader is refusing a request and still has its say."""
        assert self.upstream is not None
        try:
            while data := self.upstream.recv(CHUNK):
                self.client.sendall(data)
                self.answered += len(data)
        except OSError:
            pass
        if not self.refusing:
            with contextlib.suppress(OSError):
                self.client.shutdown(socket.SHUT_RDWR)
        self.served.discard(thread=threading.current_thread())

    def _send(self, data: bytes) -> None:
        assert self.upstream is not None
        self.upstream.sendall(data)

    def _chunked(self) -> None:
        """Carry a chunked body (and its trailers), counting the bytes it carries."""
        carried = 0
        while True:
            line = self.reader.until(b"\r\n", LINE_BYTES, "chunk header")
            if line is None:
                raise Refusal(400, "connection closed in the middle of a chunked body")
            # Hex digits only, as the proxy reads them: int(text, 16) would also take "-5", "+5", "0x5" and "1_0".
            size_text = line[:-2].split(b";", 1)[0].strip(b" \t")
            if not size_text or len(size_text) > MAX_CHUNK_DIGITS or not _HEX.issuperset(size_text):
                raise Refusal(400, "malformed chunk size")
            size = int(size_text, 16)
            carried += size
            if carried > self.bounds.request_bytes:
                raise Refusal(413, f"request body over this deployment's {self.bounds.request_bytes} bytes")
            self._send(line)
            if size == 0:
                break
            self.reader.exactly(size + 2, self._send)
        while True:  # trailers, up to the empty line
            line = self.reader.until(b"\r\n", LINE_BYTES, "trailer")
            if line is None:
                raise Refusal(400, "connection closed in the middle of a chunked body's trailers")
            self._send(line)
            if line == b"\r\n":
                return

    def _end_upstream(self) -> None:
        """The sandbox is done sending: so is the relay, and the answers still come back."""
        if self.upstream is not None:
            with contextlib.suppress(OSError):
                self.upstream.shutdown(socket.SHUT_WR)
        if self.back is not None:
            self.back.join()

    def _refuse(self, refusal: Refusal, head: Head | None, answered_before: int) -> None:
        """Stop carrying; tell the sandbox why when nothing of an answer to this request has gone back yet."""
        self.refusing = True
        if self.upstream is not None:
            with contextlib.suppress(OSError):
                self.upstream.shutdown(socket.SHUT_RDWR)
        if self.back is not None:
            self.back.join()
        if self.answered == answered_before:
            with contextlib.suppress(OSError):
                self.client.settimeout(1.0)  # the sandbox may read nothing: it does not hold this thread
                self.client.sendall(error_response(refusal.status, str(refusal), head, bytes(self.reader.buffer)))

    def _close(self) -> None:
        """End both sides; the answers' thread (woken by the shutdown, if it still ran) ends before this returns."""
        if self.upstream is not None:
            with contextlib.suppress(OSError):
                self.upstream.shutdown(socket.SHUT_RDWR)
        if self.back is not None and self.back.is_alive():
            with contextlib.suppress(OSError):
                self.client.shutdown(socket.SHUT_RDWR)
            self.back.join()
        if self.upstream is not None:
            self.served.discard(self.upstream)
            self.upstream.close()
        self.client.close()
