"""RFC 9112 and request-smuggling vectors against the proxy as compose runs it (gunicorn, ``EpollWorker``, the
proxy app, in front of the reference engine) and against a sandbox's relay in front of that proxy. Each vector
gets the RFC's answer: a 4xx, or the connection closed; never two answers to one request, never a hang, never a
5xx; and the relay's verdict is the proxy's. Behind them, a network peer trickling heads into 200 connections
holds no thread a model call needs."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httptools
import httpx
import pytest

from polar.contract.proxy_routes import hash_key
from polar.runtimes.bounds import SandboxBounds
from polar.runtimes.relay import ProxyRelay, ProxyTarget
from tests.live_proxy import LiveProxy, live_proxy

HANG_GUARD_S = 20.0  # a verdict's read gives up here: no answer and no close by then is a hang
QUIET_S = 1.5  # an answered request on a kept-alive connection: nothing more comes for this long
HEAD_S = 2.0  # the proxy's head deadline here (POLAR_HTTP_HEAD_S), and the relay's request_send_s

CHAT = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}).encode()


@dataclass
class Verdict:
    """What came back for one vector: the statuses of whole answers in order, and whether the connection ended."""

    statuses: list[int] = field(default_factory=list)
    closed: bool = False
    hung: bool = False

    def summary(self) -> tuple[tuple[int, ...], bool]:
        return tuple(self.statuses), self.closed


class _Answers:
    """Answers as the client reads them (llhttp's response side): one status per whole answer."""

    def __init__(self) -> None:
        self.statuses: list[int] = []
        self.parser = httptools.HttpResponseParser(self)

    def on_message_complete(self) -> None:
        self.statuses.append(self.parser.get_status_code())


def verdict(connect: callable, data: bytes, then: bytes = b"", pause_s: float = 0.0) -> Verdict:  # type: ignore[valid-type]
    """Sends ``data`` (and ``then`` after ``pause_s``) on a new connection; reads until the server closes it, or it
    has answered and then stayed quiet for ``QUIET_S``, or ``HANG_GUARD_S`` has passed."""
    answers, result = _Answers(), Verdict()
    sock: socket.socket = connect()
    try:
        sock.sendall(data)
        if then:
            time.sleep(pause_s)
            try:
                sock.sendall(then)
            except OSError:
                pass  # the server had closed it already
        deadline = time.monotonic() + HANG_GUARD_S
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                result.hung = not answers.statuses
                break
            sock.settimeout(min(left, QUIET_S) if answers.statuses else left)
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                if answers.statuses:
                    break  # answered; kept alive and quiet
                continue
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                result.closed = True
                break
            try:
                answers.parser.feed_data(chunk)
            except httptools.HttpParserError:
                result.statuses = [*answers.statuses, -1]  # bytes that are no answer at all
                result.closed = True
                return result
    finally:
        sock.close()
    result.statuses = answers.statuses
    return result


def _request(key: str, head: str, body: bytes = b"", path: str | None = None) -> bytes:
    target = path if path is not None else f"/s/{key}/v1/chat/completions"
    return f"POST {target} HTTP/1.1\r\n{head}\r\n".encode("latin-1") + body


def _vectors(key: str) -> dict[str, tuple[bytes, tuple[int | None, ...]]]:
    """Vector name -> (bytes, the statuses the RFC allows: a 4xx, or None for the connection closed unanswered)."""
    ok = _request(key, f"Host: x\r\nContent-Type: application/json\r\nContent-Length: {len(CHAT)}\r\n", CHAT)
    smuggled = ok  # a whole, valid second request behind the hostile one: it must never be answered
    chunked = "Host: x\r\nContent-Type: application/json\r\n"
    te = chunked + "Transfer-Encoding: chunked\r\n"
    return {
        # TE/CL conflicts and obfuscations
        "te-form-feed": (_request(key, chunked + "Transfer-Encoding:\x0cchunked\r\n", b"0\r\n\r\n") + smuggled, (400,)),
        "te-unit-separator": (
            _request(key, chunked + "Transfer-Encoding: chunked\x1f\r\n", b"0\r\n\r\n") + smuggled,
            (400,),
        ),
        "cl-form-feed": (_request(key, chunked + "Content-Length:\x0c3\r\n", b"abc") + smuggled, (400,)),
        "cl-and-te": (
            _request(key, chunked + "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n", b"0\r\n\r\n") + smuggled,
            (400,),
        ),
        "te-twice": (
            _request(key, chunked + "Transfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n", b"0\r\n\r\n"),
            (400,),
        ),
        "te-gzip-chunked": (_request(key, chunked + "Transfer-Encoding: gzip, chunked\r\n", b"0\r\n\r\n"), (400,)),
        "te-on-http-1.0": (
            b"POST /s/%s/v1/chat/completions HTTP/1.0\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
            % key.encode(),
            (400,),
        ),
        "cl-twice": (_request(key, chunked + "Content-Length: 3\r\nContent-Length: 3\r\n", b"abc"), (400,)),
        "cl-list": (_request(key, chunked + "Content-Length: 3, 3\r\n", b"abc"), (400,)),
        "cl-negative": (_request(key, chunked + "Content-Length: -1\r\n"), (400,)),
        "cl-plus": (_request(key, chunked + "Content-Length: +3\r\n", b"abc"), (400,)),
        "cl-2^64": (_request(key, chunked + "Content-Length: 18446744073709551616\r\n"), (413,)),
        "cl-4300-digits": (_request(key, chunked + "Content-Length: " + "9" * 4300 + "\r\n"), (413,)),
        "cl-200-MB-no-body": (_request(key, chunked + "Content-Length: 200000000\r\n"), (413,)),
        "space-before-colon": (_request(key, chunked + "Content-Length : 3\r\n", b"abc"), (400,)),
        # chunk-size and chunk-extension abuse
        "chunk-negative": (
            _request(key, te, b"-5\r\nhello\r\n0\r\n\r\n"),
            (400,),
        ),
        "chunk-0x": (_request(key, te, b"0x5\r\nhello\r\n0\r\n\r\n"), (400,)),
        "chunk-overflow": (
            _request(key, te, b"1" + b"0" * 16 + b"\r\nhello\r\n"),
            (400,),
        ),
        "chunk-ext-bare-lf": (
            _request(key, te, b"5;a\nb\r\nhello\r\n0\r\n\r\n") + smuggled,
            (400,),
        ),
        "chunk-data-too-long": (
            _request(key, te, b"3\r\nhelloX\r\n0\r\n\r\n") + smuggled,
            (400,),
        ),
        # bare LF, obs-fold, control characters
        "bare-lf-lines": (
            b"POST /s/%s/v1/chat/completions HTTP/1.1\nHost: x\nContent-Length: 0\n\n" % key.encode(),
            (400,),
        ),
        "bare-cr-in-value": (_request(key, chunked + "X-A: a\rb\r\nContent-Length: 0\r\n"), (400,)),
        "obs-fold": (_request(key, chunked + "X-A: a\r\n b\r\nContent-Length: 0\r\n"), (400,)),
        "nul-in-value": (_request(key, chunked + "X-A: a\x00b\r\nContent-Length: 0\r\n"), (400,)),
        # Host rules
        "host-missing": (_request(key, "Content-Length: 0\r\n"), (400,)),
        "host-twice": (_request(key, "Host: x\r\nHost: y\r\nContent-Length: 0\r\n"), (400,)),
        "host-invalid": (_request(key, "Host: a b@c\r\nContent-Length: 0\r\n"), (400,)),
        # versions, methods, targets, upgrades
        "http-2.0": (b"GET /healthz HTTP/2.0\r\nHost: x\r\n\r\n", (400,)),
        "http-0.9": (b"GET /healthz\r\n\r\n", (400,)),
        "lower-case-method": (b"get /healthz HTTP/1.1\r\nHost: x\r\n\r\n", (400,)),
        "space-in-target": (b"GET /a b HTTP/1.1\r\nHost: x\r\n\r\n", (400,)),
        "connect": (b"CONNECT vllm.internal:80 HTTP/1.1\r\nHost: vllm.internal:80\r\n\r\n", (400,)),
        "upgrade": (
            _request(key, chunked + "Connection: Upgrade\r\nUpgrade: h2c\r\nContent-Length: 0\r\n"),
            (400,),
        ),
        # oversize heads
        "head-over-64-KiB": (_request(key, chunked + "X-Big: " + "a" * 70_000 + "\r\nContent-Length: 0\r\n"), (431,)),
        "target-over-64-KiB": (b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", (431,)),
    }


@pytest.fixture(scope="module")
def served(module_database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveProxy, str, str]]:
    """The proxy (POLAR_HTTP_HEAD_S short, so slow heads end within the test), one running session's key, and a
    relay for that session (its Unix socket's path) in front of the proxy."""
    tmp = tmp_path_factory.mktemp("hostile")
    with live_proxy(module_database_url, tmp, env={"POLAR_HTTP_HEAD_S": str(HEAD_S)}) as proxy:
        _, key = proxy.session()
        relay_dir = tmp / "relay"
        relay_dir.mkdir()
        target = ProxyTarget.from_url(proxy.url)
        bounds = SandboxBounds(request_send_s=HEAD_S)
        relay = ProxyRelay(relay_dir, target, bounds=bounds, key_hash=hash_key(key))
        relay.start()
        try:
            yield proxy, key, str(relay.path)
        finally:
            relay.stop()


def _to_proxy(proxy: LiveProxy) -> callable:  # type: ignore[valid-type]
    address = urlsplit(proxy.url)
    return lambda: socket.create_connection((address.hostname, address.port), timeout=HANG_GUARD_S)


def _to_relay(path: str) -> callable:  # type: ignore[valid-type]
    def connect() -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(path)
        return sock

    return connect


def _check(name: str, got: Verdict, allowed: tuple[int | None, ...], where: str) -> None:
    assert not got.hung, f"{name} hung at the {where}"
    assert all(status < 500 for status in got.statuses), f"{name}: the {where} answered {got.statuses}"
    assert len(got.statuses) <= 1, f"{name}: the {where} answered twice: {got.statuses}"
    if got.statuses:
        assert got.statuses[0] in allowed and got.closed, f"{name}: the {where} gave {got.summary()}"
    else:
        assert None in allowed and got.closed, f"{name}: the {where} closed without the answer {allowed}"


def test_every_vector_gets_the_rfcs_answer_from_the_proxy_and_the_same_from_the_relay(
    served: tuple[LiveProxy, str, str],
) -> None:
    proxy, key, relay_path = served
    to_proxy, to_relay = _to_proxy(proxy), _to_relay(relay_path)
    control = _request(key, f"Host: x\r\nContent-Type: application/json\r\nContent-Length: {len(CHAT)}\r\n", CHAT)
    for connect in (to_proxy, to_relay):  # the vectors mean something: a well-formed request is answered
        assert verdict(connect, control).summary() == ((200,), False)
    differing = {}
    for name, (data, allowed) in _vectors(key).items():
        at_proxy, at_relay = verdict(to_proxy, data), verdict(to_relay, data)
        _check(name, at_proxy, allowed, "proxy")
        _check(name, at_relay, allowed, "relay")
        if at_proxy.summary() != at_relay.summary():
            differing[name] = (at_proxy.summary(), at_relay.summary())
    assert not differing, f"the relay and the proxy disagree: {differing}"


def test_after_an_answer_a_broken_body_closes_the_connection_without_a_second_answer(
    served: tuple[LiveProxy, str, str],
) -> None:
    """A bad key is refused (401) from the head, before the body is read; a body then broken by its chunks must
    not earn the connection a second, stray 400 that a client would read as its next request's answer."""
    proxy, _, relay_path = served
    head = "Host: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
    broken = {
        "chunk-size": b"zz\r\n",
        "chunk-data": b"3\r\nabcX\r\n",
        "chunk-ext-lf": b"3;a\nb\r\nabc\r\n",
        "negative": b"-1\r\n",
        "overflow": b"1" + b"0" * 16 + b"\r\n",
    }
    for name, body in broken.items():
        data = _request("pk-made-up", head, b"", path="/s/pk-made-up/v1/chat/completions")
        got = verdict(_to_proxy(proxy), data, then=body, pause_s=0.5)
        assert got.statuses == [401] and got.closed, f"{name}: {got.summary()}"
    # The relay refuses another session's key itself, once, with the proxy's status.
    got = verdict(_to_relay(relay_path), _request("pk-made-up", head, b""), then=b"zz\r\n", pause_s=0.5)
    assert got.statuses == [401] and got.closed


def test_a_slow_head_is_closed_at_its_deadline_by_both(served: tuple[LiveProxy, str, str]) -> None:
    proxy, key, relay_path = served
    part = f"POST /s/{key}/v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Le".encode()
    for where, connect in (("proxy", _to_proxy(proxy)), ("relay", _to_relay(relay_path))):
        got = verdict(connect, part)
        assert got.statuses == [408] and got.closed, f"{where}: {got.summary()}"


def test_200_trickling_connections_leave_model_calls_answered(served: tuple[LiveProxy, str, str]) -> None:
    """200 connections each sending a byte of a head every 20 s (re-opened when the proxy closes them at their
    head deadline) hold none of the proxy's 2 x 16 threads: every one of a stream of model calls is answered."""
    proxy, key, _ = served
    connect = _to_proxy(proxy)
    head = _request(key, "Host: x\r\nContent-Length: 1000\r\n")
    stop = threading.Event()
    opened = [0]

    def trickle() -> None:
        held: list[tuple[socket.socket, int]] = []
        while not stop.is_set():
            while len(held) < 200:
                sock = connect()
                sock.sendall(head[:1])
                held.append((sock, 1))
                opened[0] += 1
            kept = []
            for sock, sent in held:
                try:
                    sock.sendall(head[sent : sent + 1])
                    kept.append((sock, sent + 1))
                except OSError:
                    sock.close()
            held = kept
            stop.wait(20)
        for sock, _ in held:
            sock.close()

    trickler = threading.Thread(target=trickle, daemon=True)
    trickler.start()
    try:
        while opened[0] < 200:
            time.sleep(0.05)
        answered = 0
        with httpx.Client(base_url=proxy.base(key), timeout=HANG_GUARD_S) as client:
            for _ in range(20):
                reply = client.post("/v1/chat/completions", content=CHAT, headers={"Content-Type": "application/json"})
                answered += reply.status_code == 200
    finally:
        stop.set()
        trickler.join(HANG_GUARD_S + 25)
    assert answered == 20 and opened[0] >= 200
