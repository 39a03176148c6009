"""A scripted HTTP/1.1 server on a real socket, for tests of Polar's HTTP clients and relays: it reads each request
(a ``Content-Length`` or chunked body), keeps it, and sends what ``script`` returns for it."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable

# What to do with one request (its head and body): the raw bytes to send back and whether to close the connection
# after them; None closes it at once, unanswered.
Script = Callable[[bytes, bytes], tuple[bytes, bool] | None]
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


def answer_ok(head: bytes, body: bytes) -> tuple[bytes, bool]:
    return OK, False


class ScriptedServer:
    """Accepts connections on a free loopback port and answers each request by ``script``."""

    def __init__(self, script: Script = answer_ok) -> None:
        self.script = script
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.requests: list[bytes] = []
        self.connections = 0
        self._open: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            self.connections += 1
            self._open.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        reader = conn.makefile("rb")
        with conn, reader:
            while True:
                head = b""
                while not head.endswith(b"\r\n\r\n"):
                    line = reader.readline()
                    if not line:
                        return
                    head += line
                body = b""
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        body = reader.read(int(line.split(b":")[1]))
                if b"transfer-encoding: chunked" in head.lower():
                    while (line := reader.readline()) != b"0\r\n":
                        body += reader.read(int(line, 16) + 2)[:-2]
                    reader.readline()
                self.requests.append(head + body)
                answer = self.script(head, body)
                if answer is None:
                    return
                raw, close = answer
                conn.sendall(raw)
                if close:
                    return

    def drop_connections(self) -> None:
        """Close every connection accepted so far, as a server timing out idle keep-alive connections does."""
        for conn in self._open:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        self.server.close()
