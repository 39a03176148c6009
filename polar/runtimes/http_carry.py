"""On the host: one sandbox connection carried to the proxy as HTTP/1.1 requests, each held to the sandbox's bounds.

The relay (``polar.runtimes.relay``) parses each request with the reader the proxy's own server uses
(``polar.codec.http_requests``: llhttp and one framing policy), so what the relay frames is what the proxy frames,
and sends the proxy a request it rebuilt:

- the upstream connection opens only once a whole head has arrived: idle connections and slow heads never reach
  the proxy;
- the head goes upstream in origin-form (an absolute-form target's authority is dropped) with ``Host`` set to the
  proxy's own, so a load balancer in front of the proxy cannot be steered to another virtual host; header fields
  with underscores (which the proxy drops) are not carried;
- a request whose proxy key (``polar.contract.proxy_routes``) is not this session's own is refused here with 401:
  another session's key, or a flood of made-up ones, never reaches the proxy's key lookups;
- every request must be sent whole, head and body, within ``request_send_s`` of its first byte, and its body be at
  most ``request_bytes`` long (a ``Content-Length`` over it is refused before any of it is read, a chunked body as
  its chunks pass the bound); a body goes upstream as it arrives, never held whole: by its length, or re-chunked
  from the chunks' data (trailers are not carried).

A request refused before any of its answer came back gets its status (400, 401, 408, 413, 431; 502 and 503 when
the proxy or the run worker cannot carry it) in the error shape of the protocol its path names
(``polar.protocols.refusal_answer``, the proxy's own), and the connection is closed. Answers flow back byte for
byte (keep-alive, streaming) on a second thread.
"""

from __future__ import annotations

import contextlib
import hmac
import socket
import threading
import time
from collections.abc import Callable
from urllib.parse import unquote_to_bytes

from polar.codec.http_requests import Message, Refused, RequestHead, RequestReader
from polar.contract.proxy_routes import hash_key, request_key
from polar.protocols import refusal_answer
from polar.runtimes.bounds import SandboxBounds, Served

CHUNK = 64 * 1024
Refusal = Refused  # a request the relay will not carry: its status and why


class _Reader:
    """A sandbox connection read with a deadline: every read gives up (408) once ``deadline`` has passed."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.deadline: float | None = None

    def recv(self) -> bytes:
        """The next bytes (b"" at the end of the stream); 408 once the deadline has passed."""
        left = None
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise Refusal(408, "the request was not sent within this sandbox's request_send_s")
        self.sock.settimeout(left)
        try:
            return self.sock.recv(CHUNK)
        except TimeoutError:
            raise Refusal(408, "the request was not sent within this sandbox's request_send_s") from None


def _headers(head: RequestHead) -> dict[str, str]:
    """The header fields as the proxy's application reads them (WSGI's environ): lower-case names, fields with
    underscores dropped, repeated fields joined by commas."""
    headers: dict[str, str] = {}
    for name, value in head.fields:
        if "_" in name:
            continue
        lower = name.lower()
        headers[lower] = headers[lower] + "," + value if lower in headers else value
    return headers


def upstream_head(head: RequestHead, host: bytes) -> bytes:
    """The head as the proxy gets it: origin-form, ``Host`` the proxy's own, framing stated once as the relay
    sends the body (its length, or chunked)."""
    lines = [f"{head.method} {head.origin_form} {head.version}".encode("latin-1"), b"Host: " + host]
    for name, value in head.fields:
        if "_" in name or name.lower() in ("host", "content-length", "transfer-encoding"):
            continue
        lines.append(name.encode("latin-1") + b": " + value.encode("latin-1"))
    if head.chunked:
        lines.append(b"Transfer-Encoding: chunked")
    elif head.content_length:
        lines.append(b"Content-Length: %d" % head.content_length)
    return b"\r\n".join(lines) + b"\r\n\r\n"


def error_response(status: int, message: str, head: RequestHead | None, partial: str = "") -> bytes:
    """``status`` in the error shape of the protocol the request names (by its path and headers; by as much of its
    target as came when the head never finished; OpenAI's when nothing tells)."""
    if head is not None:
        return refusal_answer(status, message, head.path, head.fields)
    return refusal_answer(status, message, partial.split("?", 1)[0], [])


class Carry:
    """One sandbox connection, request by request, to a connection ``connect()`` opens once a head has come.
    ``key_hash``: the sha256 of the session's proxy key; a request carrying any other key (or none) is refused
    here (None: every key is carried, for a relay that is not one session's)."""

    def __init__(
        self,
        client: socket.socket,
        connect: Callable[[], socket.socket],
        host: bytes,
        bounds: SandboxBounds,
        served: Served | None = None,
        key_hash: str | None = None,
    ) -> None:
        self.client = client
        self.connect = connect
        self.host = host
        self.bounds = bounds
        self.key_hash = key_hash
        self.served = served if served is not None else Served()  # holds the upstream and the answers' thread
        self.reader = _Reader(client)
        self.requests = RequestReader(max_body=bounds.request_bytes, max_head=bounds.head_bytes)
        self.upstream: socket.socket | None = None
        self.back: threading.Thread | None = None
        self.answered = 0  # bytes carried back to the sandbox so far
        self.refusing = False

    def run(self) -> None:
        message: Message | None = None
        sent_at_start = 0
        try:
            # The first request's head must come within request_send_s of the connection; a later one's clock starts
            # at its first byte (until then the proxy's own keep-alive timeout ends an idle connection).
            self.reader.deadline = time.monotonic() + self.bounds.request_send_s
            while True:
                message = None  # a refusal while the next head comes is not the last request's
                message = self._next_message()
                if message is None:
                    break
                self._check_key(message.head)
                sent_at_start = self.answered
                self._open()
                self._send(upstream_head(message.head, self.host))
                self._carry_body(message)
                self.requests.done_with(message)
                self.reader.deadline = None
            self._end_upstream()
        except Refusal as refusal:
            head = refusal.head or (message.head if message is not None else None)
            self._refuse(refusal, head, sent_at_start)
        except OSError:
            pass
        finally:
            self._close()

    def _next_message(self) -> Message | None:
        """The next request whose head is whole; None when the sandbox ended the connection between requests."""
        requests, reader = self.requests, self.reader
        while (message := requests.next_message()) is None:
            data = reader.recv()
            if not data:
                if requests.partial:
                    raise Refusal(400, "connection closed in the middle of the request head")
                return None
            if reader.deadline is None:  # a later request's clock starts at its first byte
                reader.deadline = time.monotonic() + self.bounds.request_send_s
            requests.feed(data)
        if reader.deadline is None:  # it came whole behind the one before
            reader.deadline = time.monotonic() + self.bounds.request_send_s
        return message

    def _check_key(self, head: RequestHead) -> None:
        """401 for a request whose proxy key is not this session's (compared by hash, in constant time)."""
        if self.key_hash is None:
            return
        path = head.path
        path = unquote_to_bytes(path).decode("latin-1") if "%" in path else path  # as the proxy's PATH_INFO
        query = head.origin_form.partition("?")[2]
        key = request_key(path, _headers(head), query)
        if key is None or not hmac.compare_digest(hash_key(key), self.key_hash):
            raise Refusal(401, "this sandbox's relay carries only its own session's proxy key", head)

    def _carry_body(self, message: Message) -> None:
        """The body upstream as its pieces arrive: as they are for a length, each as a chunk when chunked."""
        chunked = message.head.chunked
        while True:
            pieces = message.pieces
            while pieces:
                piece = pieces.popleft()
                self._send(b"%x\r\n%b\r\n" % (len(piece), piece) if chunked else piece)
            if message.complete:
                break
            self.requests.check(message)  # bytes already read may hold its refusal: no wait for more
            data = self.reader.recv()
            if not data:
                raise Refusal(400, "connection closed in the middle of the request body", message.head)
            self.requests.feed(data)
            self.requests.check(message)
        if chunked:
            self._send(b"0\r\n\r\n")

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

    def _end_upstream(self) -> None:
        """The sandbox is done sending: so is the relay, and the answers still come back."""
        if self.upstream is not None:
            with contextlib.suppress(OSError):
                self.upstream.shutdown(socket.SHUT_WR)
        if self.back is not None:
            self.back.join()

    def _refuse(self, refusal: Refusal, head: RequestHead | None, answered_before: int) -> None:
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
                self.client.sendall(error_response(refusal.status, str(refusal), head, self.requests.url_so_far))

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
