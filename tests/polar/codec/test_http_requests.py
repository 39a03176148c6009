"""``polar.codec.http_requests``, the reader the proxy's server and the sandbox relay share: pipelined requests in
order with a refusal kept for the request it belongs to, bodies in the pieces their bytes came in (nothing
allocated for a declared length), and the bounds on heads and bodies."""

from __future__ import annotations

import tracemalloc

import pytest

from polar.codec.http_requests import Refused, RequestReader

OK = b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc"


def _taken(reader: RequestReader) -> list[tuple[str, bytes]]:
    taken = []
    while (message := reader.next_message()) is not None:
        taken.append((message.head.target, b"".join(message.pieces)))
        reader.done_with(message)
    return taken


def test_pipelined_requests_come_in_order_and_a_broken_one_is_refused_after_the_whole_ones() -> None:
    reader = RequestReader()
    reader.feed(OK + OK.replace(b"/a", b"/b") + b"GET /c HTTP/1.1\nHost: x\n\n")
    with pytest.raises(Refused) as refused:
        _taken_so_far = []
        while (message := reader.next_message()) is not None:
            _taken_so_far.append(message.head.target)
            reader.done_with(message)
    assert _taken_so_far == ["/a", "/b"] and refused.value.status == 400


def test_a_request_split_anywhere_reads_the_same() -> None:
    data = OK + b"POST /d HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
    for cut in range(1, len(data)):
        reader = RequestReader()
        reader.feed(data[:cut])
        reader.feed(data[cut:])
        assert _taken(reader) == [("/a", b"abc"), ("/d", b"abcde")], cut


def test_a_declared_length_allocates_nothing_before_its_bytes_arrive() -> None:
    reader = RequestReader()
    tracemalloc.start()
    try:
        reader.feed(b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 200000000\r\n\r\n")
        message = reader.next_message()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert message is not None and message.head.content_length == 200_000_000 and not message.complete
    assert peak < 1_000_000  # bytes, for a body that says 200 MB


def test_bodies_over_the_bound_are_refused_before_or_as_they_arrive() -> None:
    reader = RequestReader(max_body=10)
    reader.feed(b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 11\r\n\r\n")
    with pytest.raises(Refused) as by_length:
        reader.next_message()
    chunked = RequestReader(max_body=10)
    chunked.feed(b"POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n8\r\n12345678\r\n")
    message = chunked.next_message()
    assert message is not None
    chunked.feed(b"8\r\n12345678\r\n")
    with pytest.raises(Refused) as by_chunks:
        chunked.check(message)
    assert by_length.value.status == by_chunks.value.status == 413


def test_a_head_that_never_ends_is_refused_past_64_KiB() -> None:
    reader = RequestReader()
    reader.feed(b"GET / HTTP/1.1\r\nHost: x\r\nX-A: ")
    for _ in range(70):
        reader.feed(b"a" * 1024)
    with pytest.raises(Refused) as refused:
        reader.next_message()
    assert refused.value.status == 431 and reader.partial


@pytest.mark.parametrize(
    ("target", "origin", "path"),
    [
        ("/s/k/v1/models?x=1", "/s/k/v1/models?x=1", "/s/k/v1/models"),
        ("http://vllm.internal/v1/models", "/v1/models", "/v1/models"),
        ("http://vllm.internal", "/", "/"),
        ("http://h?q=1", "/?q=1", "/"),
        # A slash after the query is query, not path: the path routed on is the one forwarded.
        ("http://h?x/s/KEY/v1/models", "/?x/s/KEY/v1/models", "/"),
    ],
)
def test_an_absolute_form_target_is_sent_on_in_origin_form(target: str, origin: str, path: str) -> None:
    reader = RequestReader()
    reader.feed(f"GET {target} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    message = reader.next_message()
    assert message is not None and (message.head.origin_form, message.head.path) == (origin, path)
