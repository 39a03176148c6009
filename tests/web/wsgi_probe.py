"""A WSGI app that shows a test what the server gave it: ``tests/web/test_gunicorn_worker.py`` serves it with
``web.gunicorn_worker.EpollWorker`` (as ``ProbeWorker``). ``PROBE_LOG`` names a file it appends events to (a stream
closed early)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Iterator
from typing import Any
from urllib.parse import parse_qs

from polar.codec.instance import instance_headers
from web.gunicorn_worker import EpollWorker
from web.proxy.delivery import client_gone


class ProbeWorker(EpollWorker):
    """The proxy's worker waiting 15 s, not 30, for a new connection's first request: a test sees both that wait
    outlast ``--keep-alive`` and a silent connection closed when it runs out. 15 s leaves the keep-alive test
    (2 s, and up to 1 s for the loop to look) a wide margin on a loaded machine."""

    first_request_s = 15.0


def _log(event: str) -> None:
    with open(os.environ["PROBE_LOG"], "a") as log:
        log.write(event + "\n")


def _json(start_response: Any, status: str, value: Any) -> list[bytes]:
    body = json.dumps(value).encode()
    start_response(status, [("Content-Type", "application/json"), ("Content-Length", str(len(body))),
                            *instance_headers().items()])  # fmt: skip
    return [body]


def _stream(count: int, delay: float, name: str) -> Iterator[bytes]:
    try:
        for i in range(count):
            yield f"data: {i}\n\n".encode()
            time.sleep(delay)
        _log(f"{name} finished")
    except GeneratorExit:
        _log(f"{name} cut")
        raise


def app(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
    path, query = environ["PATH_INFO"], parse_qs(environ["QUERY_STRING"])
    if path == "/healthz":
        return _json(start_response, "200 OK", {"status": "ok"})
    if path == "/echo":
        body = environ["wsgi.input"].read()
        start_response("200 OK", [("Content-Type", "application/octet-stream"), ("Content-Length", str(len(body)))])
        return [body]
    if path == "/lines":
        return _json(start_response, "200 OK", [line.decode() for line in environ["wsgi.input"]])
    if path.startswith("/environ"):
        shown = {key: value for key, value in environ.items() if isinstance(value, (str, bool))}
        # ?wait_gone=S: asked again until the client is gone or S seconds pass (its close may come after its request)
        deadline = time.monotonic() + float(query.get("wait_gone", ["0"])[0])
        while not (gone := client_gone(environ)) and time.monotonic() < deadline:
            time.sleep(0.01)
        return _json(start_response, "200 OK", {**shown, "client_gone": gone})
    if path == "/slow":
        time.sleep(float(query["s"][0]))
        return _json(start_response, "200 OK", {"slept": float(query["s"][0])})
    if path == "/stream":
        start_response("200 OK", [("Content-Type", "text/event-stream")])
        return _stream(int(query["n"][0]), float(query.get("delay", ["0"])[0]), query.get("name", ["stream"])[0])
    if path == "/short":  # says 10 bytes, sends 2: the connection must not be reused
        start_response("200 OK", [("Content-Length", "10")])
        return [b"ab"]
    if path == "/fail":
        raise RuntimeError("the probe fails on purpose")
    return _json(start_response, "404 Not Found", {"path": path})
