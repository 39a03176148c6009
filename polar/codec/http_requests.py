"""HTTP/1.1 requests as Polar reads them: one parser and one framing policy for the proxy's server
(``web.http1``) and the sandbox relay (``polar.runtimes.http_carry``), so the relay can never frame a request
differently from the proxy behind it (the difference is where a smuggled request hides).

The parser is llhttp, Node's, through ``httptools`` (as uvicorn uses it), with none of its leniencies set. It
refuses, among others: bare LF and bare CR line endings, obsolete line folding, control characters (form feed,
unit separator, NUL) in field values, whitespace before a field's colon, ``Content-Length`` that is not plain
digits or that overflows 64 bits, a repeated ``Content-Length``, ``Content-Length`` beside ``Transfer-Encoding``,
``chunked`` that is not the last coding, chunk sizes that are not hex digits or overflow, a bare LF in a chunk
extension, chunk data not followed by CRLF, and unknown methods.

On top, this module refuses (``Refused``), always with a 4xx: where RFC 9112 allows a 501 (a transfer coding not
understood) or a 505 (a version not served), Polar answers 400, because a 5xx reads to clients and to Polar's own
bookkeeping as the server failing, and these are the caller's faults:

- 400 for a version other than HTTP/1.0 and HTTP/1.1 (or none, HTTP/0.9's request line), for a transfer coding
  other than ``chunked`` alone, for a missing, repeated or malformed ``Host`` on HTTP/1.1 (a repeated or malformed
  one on HTTP/1.0), for ``Transfer-Encoding`` on HTTP/1.0, for ``CONNECT`` and ``Upgrade`` (Polar serves neither),
  for a target that is neither origin-form (``/path``), absolute-form (``http://host/path``) nor ``*``;
- 431 for a head over ``MAX_HEAD`` bytes, and 413 for a body over the reader's ``max_body`` (a Content-Length
  before any of it is read, one past 2^64 included; a chunked body as its chunks arrive).

Nothing is allocated before its bytes arrive: a body is handed on in the pieces the connection delivered.
"""

from __future__ import annotations

import re
from collections import deque

import httptools

MAX_HEAD = 64 * 1024
# RFC 9110 §7.2 / RFC 3986: uri-host [":" port]; an IP literal in brackets, else a reg-name or IPv4 address.
_HOST = re.compile(r"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9\-._~!$&'()*+,;=%]*)(?::[0-9]*)?")
_ABSOLUTE = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://")


class Refused(Exception):
    """A request refused before the application sees it: ``status`` (4xx, 505) and why. ``head`` is the request's
    head when it was parsed before the refusal (the relay answers in the error shape of the protocol it names)."""

    def __init__(self, status: int, reason: str, head: RequestHead | None = None) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.head = head


class RequestHead:
    """A parsed request head: ``method``, ``target`` and ``version`` as sent, the header ``fields`` in order
    (names as sent), and the body's framing."""

    __slots__ = ("chunked", "content_length", "fields", "keep_alive", "method", "target", "version")

    def __init__(
        self,
        method: str,
        target: str,
        version: str,
        fields: list[tuple[str, str]],
        keep_alive: bool,
    ) -> None:
        self.method, self.target, self.version, self.fields = method, target, version, fields
        self.keep_alive = keep_alive
        self.content_length: int | None = None  # None: chunked
        self.chunked = False

    def field(self, name: str) -> str | None:
        """Field ``name`` (lower case), repeated values joined by commas; None when absent."""
        values = [value for key, value in self.fields if key.lower() == name]
        return ", ".join(values) if values else None

    def count(self, name: str) -> int:
        """How many times field ``name`` (lower case) was sent."""
        return sum(1 for key, _ in self.fields if key.lower() == name)

    def tokens(self, name: str) -> list[str]:
        """The comma-separated tokens of field ``name``, lower case, in order (empty list elements dropped)."""
        value = self.field(name)
        if not value:
            return []
        return [token for token in (part.strip(" \t").lower() for part in value.split(",")) if token]

    @property
    def path(self) -> str:
        """The target's path (origin-form or absolute-form), without its query: that of ``origin_form``, so whoever
        routes on the path and whoever forwards the request read the same one."""
        return self.origin_form.split("?", 1)[0]

    @property
    def origin_form(self) -> str:
        """The target as an origin server is sent it: an absolute-form target's path and query (its authority,
        which only the next hop would route on, is dropped)."""
        if not _ABSOLUTE.match(self.target):
            return self.target
        rest = self.target.split("://", 1)[1]
        cut = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
        tail = rest[cut:]
        return tail if tail.startswith("/") else "/" + tail

    @property
    def expects_continue(self) -> bool:
        return "100-continue" in self.tokens("expect")


def _framed(head: RequestHead, version: str, max_body: int | None) -> None:
    """Polar's policy over what llhttp accepted: sets ``head``'s framing or raises ``Refused``."""
    if version == "0.9":  # a request line without a version (HTTP/0.9's), which HTTP/1.1 does not have
        raise Refused(400, "malformed request line: no HTTP version", head)
    if version not in ("1.1", "1.0"):
        raise Refused(400, "only HTTP/1.0 and HTTP/1.1 are served", head)
    if head.method == "CONNECT" or head.count("upgrade"):
        raise Refused(400, "CONNECT and protocol upgrades are not served", head)
    target = head.target
    if not (target.startswith("/") or target == "*" or _ABSOLUTE.match(target)):
        raise Refused(400, "malformed request target", head)
    hosts = [value for name, value in head.fields if name.lower() == "host"]
    if len(hosts) > 1:
        raise Refused(400, "more than one Host field", head)
    if not hosts and version == "1.1":
        raise Refused(400, "an HTTP/1.1 request needs a Host field", head)
    if hosts and not _HOST.fullmatch(hosts[0]):
        raise Refused(400, "malformed Host field", head)
    codings = head.tokens("transfer-encoding")
    if codings:
        if version == "1.0":
            raise Refused(400, "Transfer-Encoding on an HTTP/1.0 request", head)
        if codings != ["chunked"]:
            raise Refused(400, "only the chunked transfer coding is served", head)
        head.chunked = True
        return
    length = head.field("content-length")  # llhttp let through only one, of digits, within 64 bits
    head.content_length = int(length) if length else 0
    if max_body is not None and head.content_length > max_body:
        raise Refused(413, f"a request body of {head.content_length} bytes is over this server's {max_body}", head)


class Message:
    """One request on a connection: its head, the pieces of its body not yet taken, and whether it has ended."""

    __slots__ = ("complete", "head", "pieces", "received")

    def __init__(self, head: RequestHead) -> None:
        self.head = head
        self.pieces: deque[bytes] = deque()
        self.received = 0  # body bytes so far
        self.complete = False


class RequestReader:
    """The requests of one connection, from the bytes ``feed`` is given: messages whose heads are complete, in
    order, each with its body's pieces as they arrive. A refusal belongs to the first message not yet complete:
    the messages before it are whole and are served first (``next_message``, ``Body`` reads raise it after)."""

    def __init__(self, max_body: int | None = None, max_head: int = MAX_HEAD) -> None:
        self.max_body = max_body
        self.max_head = max_head
        self._parser = httptools.HttpRequestParser(self)
        self._messages: deque[Message] = deque()
        self._refused: Refused | None = None
        self._in_head = False  # between a message's first byte and the end of its head
        self._head_fed = 0  # bytes fed while a head was incomplete (at most one earlier message's tail over)
        self._trailers = 0
        self._url: list[bytes] = []
        self._fields: list[tuple[str, str]] = []
        self._parsing: Message | None = None  # the message whose body llhttp is reading

    # What a connection's reader asks.

    def feed(self, data: bytes) -> None:
        """Parses ``data``; a refusal is kept for the message it belongs to (``refused``)."""
        if self._refused is not None:
            return  # nothing after a refusal can be framed
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            context = exc.__context__
            self._refused = context if isinstance(context, Refused) else Refused(400, str(exc))
        except httptools.HttpParserInvalidMethodError:
            self._refused = Refused(400, "malformed or unknown request method")
        except httptools.HttpParserUpgrade:  # unreachable: CONNECT and Upgrade are refused at their head
            self._refused = Refused(400, "CONNECT and protocol upgrades are not served")
        except httptools.HttpParserError as exc:
            if str(exc) == "Content-Length overflow":  # digits past 2^64: over any bound there is
                self._refused = Refused(413, "a Content-Length over 2^64 bytes")
            else:
                self._refused = Refused(400, f"malformed request: {exc}")
        if self._refused is None and self._in_head:  # the head so far, held inside llhttp's caller: bounded
            self._head_fed += len(data)
            if self._head_fed > self.max_head:
                self._refused = Refused(431, f"the request head is over {self.max_head // 1024} KiB")

    def next_message(self) -> Message | None:
        """The oldest request whose head is complete; None when more bytes are needed. Raises the refusal once
        every message before it has been taken."""
        if self._messages:
            return self._messages[0]
        if self._refused is not None:
            raise self._refused
        return None

    def done_with(self, message: Message) -> None:
        """``message`` has been answered: the next one (if it has come) is first."""
        if self._messages and self._messages[0] is message:
            self._messages.popleft()

    def check(self, message: Message) -> None:
        """Raises the refusal if it belongs to ``message`` (its body is what the parser refused)."""
        if self._refused is not None and not message.complete:
            raise self._refused

    @property
    def has_message(self) -> bool:
        """A request whose head is complete is waiting to be taken."""
        return bool(self._messages)

    @property
    def refused(self) -> Refused | None:
        return self._refused

    @property
    def partial(self) -> bool:
        """Bytes of a request have come whose head is not complete yet (an idle connection has none)."""
        return self._in_head

    @property
    def url_so_far(self) -> str:
        """The request target of a head still arriving, as far as it came (for the error shape of a refusal)."""
        return b"".join(self._url).decode("latin-1")

    # llhttp's callbacks (httptools calls them on this object).

    def on_message_begin(self) -> None:
        self._in_head = True
        self._head_fed = 0
        self._trailers = 0
        self._url = []
        self._fields = []

    def on_url(self, url: bytes) -> None:
        self._url.append(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._in_head:
            self._fields.append((name.decode("latin-1"), value.decode("latin-1")))
            return
        self._trailers += len(name) + len(value)  # a chunked body's trailers: ignored, but bounded like a head
        if self._trailers > self.max_head:
            raise Refused(431, f"the request's trailers are over {self.max_head // 1024} KiB")

    def on_headers_complete(self) -> None:
        self._in_head = False
        parser = self._parser
        head = RequestHead(
            parser.get_method().decode("ascii"),
            b"".join(self._url).decode("latin-1"),
            "HTTP/" + parser.get_http_version(),
            self._fields,
            parser.should_keep_alive(),
        )
        size = len(head.target) + sum(len(name) + len(value) + 4 for name, value in head.fields)
        if size > self.max_head:
            raise Refused(431, f"the request head is over {self.max_head // 1024} KiB", head)
        _framed(head, parser.get_http_version(), self.max_body)
        message = Message(head)
        self._messages.append(message)
        self._parsing = message

    def on_body(self, body: bytes) -> None:
        message = self._parsing
        assert message is not None
        message.received += len(body)
        if self.max_body is not None and message.received > self.max_body:
            raise Refused(413, f"a request body over this server's {self.max_body} bytes", message.head)
        message.pieces.append(body)

    def on_message_complete(self) -> None:
        if self._parsing is not None:
            self._parsing.complete = True
            self._parsing = None
