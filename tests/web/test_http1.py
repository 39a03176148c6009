"""``web.http1`` pieces on a socket pair: request bodies read in any sizes, by length or chunked, leaving a pipelined
next request to the connection's reader; answers framed by their length, chunked, or the connection's end."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from polar.codec.http_requests import RequestHead, RequestReader
from web import http1


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    server, client = socket.socketpair()
    http1.set_io_timeout(server, 5)
    with server, client:
        yield server, client


def _body(server: socket.socket, reader: RequestReader, head: bytes) -> http1.Body:
    reader.feed(head + b"\r\nHost: x\r\n\r\n")
    message = reader.next_message()
    assert message is not None
    return http1.Body(server, reader, message)


def _head(head: bytes) -> RequestHead:
    reader = RequestReader()
    reader.feed(head + b"\r\nHost: x\r\n\r\n")
    message = reader.next_message()
    assert message is not None
    return message.head


def _chunked(data: bytes, size: int) -> bytes:
    pieces = [data[i : i + size] for i in range(0, len(data), size)]
    return b"".join(b"%x\r\n%b\r\n" % (len(piece), piece) for piece in pieces) + b"0\r\n\r\n"


@pytest.mark.parametrize("chunked", [False, True])
@pytest.mark.parametrize("read_size", [1, 7, 4096, -1])
def test_a_body_reads_whole_in_any_sizes_and_leaves_the_next_request(
    pair: tuple[socket.socket, socket.socket], chunked: bool, read_size: int
) -> None:
    server, client = pair
    data = bytes(range(256)) * 40 + b"line one\nline two\n"
    if chunked:
        head, sent = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked", _chunked(data, 333)
    else:
        head, sent = b"POST / HTTP/1.1\r\nContent-Length: %d" % len(data), data
    client.sendall(sent + b"GET /next HTTP/1.1\r\nHost: x\r\n\r\n")
    reader = RequestReader()
    body = _body(server, reader, head)
    got = b""
    while piece := body.read(read_size):
        got += piece
        if read_size < 0:
            break
    assert got == data and body.done and body.read() == b""
    reader.done_with(body._message)
    following = http1.next_request(server, reader)
    assert following is not None and following.head.target == "/next"


def test_readline_honours_its_limit_and_keeps_the_rest(pair: tuple[socket.socket, socket.socket]) -> None:
    server, client = pair
    data = b"abcdefgh\nsecond\nthird"
    client.sendall(_chunked(data, 3))
    body = _body(server, RequestReader(), b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked")
    assert body.readline(4) == b"abcd"
    assert body.readline() == b"efgh\n"
    assert body.readlines() == [b"second\n", b"third"]


def test_a_chunk_longer_than_its_size_is_refused_at_once(pair: tuple[socket.socket, socket.socket]) -> None:
    """The two bytes after a chunk's data must be its CRLF: the body does not read on looking for a line end."""
    server, client = pair
    client.sendall(b"5\r\nhelloXY")
    client.shutdown(socket.SHUT_WR)  # nothing more comes: reading on would end the connection, not refuse the chunk
    body = _body(server, RequestReader(), b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked")
    with pytest.raises(http1.BadRequest) as refused:
        body.read()
    assert refused.value.status == 400 and "after chunk data" in refused.value.reason


def test_a_body_cut_short_is_a_client_gone(pair: tuple[socket.socket, socket.socket]) -> None:
    server, client = pair
    client.sendall(b"only part")
    client.shutdown(socket.SHUT_WR)
    body = _body(server, RequestReader(), b"POST / HTTP/1.1\r\nContent-Length: 100")
    with pytest.raises(http1.ClientGone):
        body.read()


def _answer_bytes(server: socket.socket, client: socket.socket, head: bytes, status: str,
                  headers: list[tuple[str, str]], chunks: list[bytes]) -> tuple[bytes, bool]:  # fmt: skip
    request = _head(head)
    answer = http1.Answer(server, request, request.keep_alive)
    http1.run_app(lambda environ, start: (start(status, headers), chunks)[1], {}, answer)
    server.shutdown(socket.SHUT_WR)
    received = b""
    while data := client.recv(65536):
        received += data
    return received, answer.keep_alive


def test_answers_are_framed_by_length_chunks_or_closing(pair: tuple[socket.socket, socket.socket]) -> None:
    server, client = pair
    sent, keep = _answer_bytes(server, client, b"GET / HTTP/1.1", "200 OK", [("Content-Length", "5")], [b"hel", b"lo"])
    assert sent.startswith(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nDate: ") and sent.endswith(b"\r\n\r\nhello")
    assert keep


def test_an_answer_without_a_length_is_chunked_and_empty_chunks_skipped(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    server, client = pair
    sent, keep = _answer_bytes(server, client, b"GET / HTTP/1.1", "200 OK", [], [b"ab", b"", b"cde"])
    assert b"Transfer-Encoding: chunked\r\n" in sent and sent.endswith(b"\r\n\r\n2\r\nab\r\n3\r\ncde\r\n0\r\n\r\n")
    assert keep


def test_http_1_0_without_a_length_closes_and_hop_by_hop_fields_are_the_servers(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    server, client = pair
    headers = [("Connection", "keep-alive"), ("Transfer-Encoding", "gzip"), ("X-Kept", "yes")]
    sent, keep = _answer_bytes(server, client, b"GET / HTTP/1.0\r\nConnection: keep-alive", "200 OK", headers, [b"x"])
    assert not keep and b"Connection: close\r\n" in sent and b"X-Kept: yes\r\n" in sent
    assert b"gzip" not in sent and sent.endswith(b"\r\n\r\nx")


def test_a_header_value_with_a_line_break_is_refused(pair: tuple[socket.socket, socket.socket]) -> None:
    server, _ = pair
    answer = http1.Answer(server, _head(b"GET / HTTP/1.1"), True)
    with pytest.raises(ValueError, match="line break"):
        answer.start_response("200 OK", [("X-Injected", "a\r\nSet-Cookie: b")])
