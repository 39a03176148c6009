"""``PolarClient.submit`` always sends an Idempotency-Key and retries infrastructure failures with the same key.

The server here is a real HTTP server (the standard library's) that answers as the API would after a failure: the
first try gets a 503, the next a 201. The API's own replay of a key is tested in ``tests/web/api/test_api.py`` and
end to end in ``tests/e2e/test_gym_agent.py``.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from polar.client import APIError, PolarClient


class _Scripted(BaseHTTPRequestHandler):
    answers: list[int] = []
    keys: list[str | None] = []

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        type(self).keys.append(self.headers.get("Idempotency-Key"))
        status = type(self).answers.pop(0)
        body = json.dumps({"batch_id": "b-1", "num_sessions": 1} if status < 400 else {"error": {"message": "x"}})
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def api() -> Iterator[type[_Scripted]]:
    handler = type("Handler", (_Scripted,), {"answers": [], "keys": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    handler.url = f"http://127.0.0.1:{server.server_address[1]}"  # type: ignore[attr-defined]
    yield handler
    server.shutdown()
    server.server_close()


def test_a_submission_always_carries_a_key_and_a_retry_reuses_it(api: type[_Scripted]) -> None:
    client = PolarClient(api.url)  # type: ignore[attr-defined]
    api.answers += [503, 429, 201, 201]
    assert client.submit({"tasks": []}) == {"batch_id": "b-1", "num_sessions": 1}
    first, again, third = api.keys
    assert first and first == again == third  # one submission, one key, however many tries
    client.submit({"tasks": []})
    assert api.keys[3] and api.keys[3] != first  # the next submission is another batch: a fresh key
    api.answers += [201]
    client.submit({"tasks": []}, idempotency_key="mine")
    assert api.keys[4] == "mine"


def test_a_refusal_is_not_retried(api: type[_Scripted]) -> None:
    api.answers += [409]
    with pytest.raises(APIError) as refused:
        PolarClient(api.url).submit({"tasks": []}, idempotency_key="k")  # type: ignore[attr-defined]
    assert refused.value.status == 409 and api.keys == ["k"]
