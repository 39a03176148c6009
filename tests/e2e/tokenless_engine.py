"""An engine that answers chat completions in vLLM's shape but without what token-exact capture needs, as vLLM
before 0.10.2 or gpt-oss on vLLM 0.10.2-0.11.0 do: the prompt's words pick what is missing (``no-ids``: no
``prompt_token_ids`` nor ``token_ids``; ``no-logprobs``: ids but no ``logprobs.content``; ``short-logprobs``: one
logprob fewer than ids; otherwise a whole answer). A real HTTP server on a free port, in a thread."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MODEL = "tokenless"


def answer(prompt: str) -> dict[str, Any]:
    choice: dict[str, Any] = {
        "index": 0,
        "message": {"role": "assistant", "content": "Hello there."},
        "finish_reason": "stop",
        "token_ids": [9906, 1070, 13],
        "logprobs": {"content": [{"token": t, "logprob": -0.5} for t in ("Hello", " there", ".")]},
    }
    body: dict[str, Any] = {
        "id": "chatcmpl-tokenless", "object": "chat.completion", "created": 0, "model": MODEL,
        "choices": [choice], "prompt_token_ids": [1, 2, 3, 4],
        "usage": {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7},
    }  # fmt: skip
    if "no-ids" in prompt:
        del body["prompt_token_ids"], choice["token_ids"]
    elif "no-logprobs" in prompt:
        choice["logprobs"] = None
    elif "short-logprobs" in prompt:
        choice["logprobs"]["content"].pop()
    return body


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/v1/models":
            self._send(200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})
        elif self.path == "/health":
            self._send(200, {})
        else:
            self._send(404, {"error": {"message": "not here"}})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        if self.path != "/v1/chat/completions":
            self._send(404, {"error": {"message": "not here"}})
            return
        self._send(200, answer(json.dumps(body.get("messages"))))


@contextmanager
def tokenless_engine() -> Iterator[str]:
    """The engine's base URL while the ``with`` block runs."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
