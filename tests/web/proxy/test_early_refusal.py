"""The proxy refuses early: a bad key, a body over its protocol's cap, and a session with no slot free are
answered from the request's head, in the caller's protocol, without waiting for a body the client never sends.
Each request here sends its head only; a proxy that read the body first would hang to the socket's hang guard."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
import redis

from tests.live_proxy import LiveProxy, live_proxy
from tests.processes import wait_until

HANG_GUARD_S = 20  # the socket timeout a proxy reading bodies first would run into


@pytest.fixture
def proxy(database_url: str, broker_url: str, tmp_path: Path) -> Iterator[LiveProxy]:
    # Redis-backed limits: both proxy workers count the session's slots together.
    with live_proxy(database_url, tmp_path, env={"POLAR_REDIS_URL": broker_url}) as live:
        live.redis_url = broker_url  # type: ignore[attr-defined]
        yield live


def test_the_proxy_refuses_early(proxy: LiveProxy) -> None:
    """One proxy for the five cases (starting one is most of the cost)."""
    a_bad_key_is_refused_before_the_body_is_read(proxy)
    a_body_over_its_protocols_cap_is_refused_before_it_is_read(proxy)
    a_count_tokens_body_over_its_own_cap_is_refused_before_it_is_read(proxy)
    the_sessions_slot_is_taken_before_the_body_is_read(proxy)
    a_body_of_too_many_values_is_refused_before_it_is_parsed(proxy)


def head_only(proxy: LiveProxy, path: str, length: int, headers: str = "") -> tuple[socket.socket, bytes]:
    """Send ``path``'s head saying ``length`` body bytes and none of them; the connection and what came back."""
    address = urlsplit(proxy.url)
    conn = socket.create_connection((address.hostname, address.port), timeout=HANG_GUARD_S)
    conn.sendall(
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{headers}"
        f"Content-Length: {length}\r\n\r\n".encode()
    )
    return conn, answer(conn)


def answer(conn: socket.socket) -> bytes:
    """One whole answer (head and Content-Length body)."""
    got = b""
    while b"\r\n\r\n" not in got or len(got.partition(b"\r\n\r\n")[2]) < length_of(got):
        chunk = conn.recv(65536)
        if not chunk:
            break
        got += chunk
    return got


def length_of(raw: bytes) -> int:
    for line in raw.partition(b"\r\n\r\n")[0].split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":")[1])
    return 0


def status_and_body(raw: bytes) -> tuple[int, dict]:  # type: ignore[type-arg]
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), json.loads(body)


def a_bad_key_is_refused_before_the_body_is_read(proxy: LiveProxy) -> None:
    conn, raw = head_only(proxy, "/s/pk-nope/v1/messages", 1_000_000)
    conn.close()
    status, body = status_and_body(raw)
    assert status == 401 and body["type"] == "error"  # Anthropic's shape


def a_body_over_its_protocols_cap_is_refused_before_it_is_read(proxy: LiveProxy) -> None:
    _, key = proxy.session()
    conn, raw = head_only(proxy, f"/s/{key}/v1beta/models/m:generateContent", 21 * 1024 * 1024)
    conn.close()
    status, body = status_and_body(raw)
    assert status == 413 and body["error"]["code"] == 413  # Gemini's cap (20 MiB) and shape


def a_count_tokens_body_over_its_own_cap_is_refused_before_it_is_read(proxy: LiveProxy) -> None:
    """Audit G10: counting tokens took bodies up to the generation cap (32 MiB), each tokenised whole by the engine.
    Its cap is ``POLAR_MAX_COUNT_TOKENS_BYTES`` (4 MiB): 5 MiB is refused, in the caller's protocol, naming it."""
    _, key = proxy.session()
    length = 5 * 1024 * 1024  # under every generation cap
    for path, shape in ((f"/s/{key}/v1/messages/count_tokens", "anthropic"),
                        (f"/s/{key}/v1beta/models/m:countTokens", "gemini")):  # fmt: skip
        conn, raw = head_only(proxy, path, length)
        conn.close()
        status, body = status_and_body(raw)
        assert status == 413, raw
        message = body["error"]["message"]
        assert f"over this proxy's {4 * 1024 * 1024}-byte limit for counting tokens" in message
        assert "POLAR_MAX_COUNT_TOKENS_BYTES" in message
        assert (body["type"] == "error") if shape == "anthropic" else (body["error"]["code"] == 413)
    # A count-tokens body under the cap is still counted.
    answer = httpx.post(f"{proxy.base(key)}/v1/messages/count_tokens", timeout=HANG_GUARD_S,
                        json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})  # fmt: skip
    assert answer.status_code == 200 and answer.json()["input_tokens"] > 0


def the_sessions_slot_is_taken_before_the_body_is_read(proxy: LiveProxy) -> None:
    session_id, key = proxy.session(max_concurrent_calls=1)
    address = urlsplit(proxy.url)
    holder = socket.create_connection((address.hostname, address.port), timeout=HANG_GUARD_S)
    holder.sendall(f"POST /s/{key}/v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{{".encode())
    in_flight = redis.Redis.from_url(proxy.redis_url)  # type: ignore[attr-defined]
    try:
        # The holder's body never comes: it holds the session's one slot while the proxy waits for it.
        wait_until(lambda: in_flight.zcard(f"polar:calls:{{{session_id}}}:inflight") == 1, HANG_GUARD_S, "held")
        conn, raw = head_only(proxy, f"/s/{key}/v1/chat/completions", 1000)
        conn.close()
        status, body = status_and_body(raw)
        assert status == 429 and "max_concurrent_calls" in body["error"]["message"]
    finally:
        holder.close()
        in_flight.close()


def a_body_of_too_many_values_is_refused_before_it_is_parsed(proxy: LiveProxy) -> None:
    _, key = proxy.session()
    body = b'{"model":"m","messages":[' + b"{}," * 1_100_000 + b'{"role":"user","content":"hi"}]}'
    answer = httpx.post(f"{proxy.url}/s/{key}/v1/chat/completions", content=body, timeout=HANG_GUARD_S * 3)
    assert answer.status_code == 413 and "JSON values" in answer.json()["error"]["message"]
