"""The model-API proxy (DESIGN.md §4): ``gunicorn -k web.gunicorn_worker.EpollWorker 'web.proxy:create_app()'``.

Base URL per session: ``/s/<key>``, optionally ``/s/<key>/a/<agent>``; the key is also accepted as any
provider's API key on un-prefixed paths. ``polar.protocols.detect`` picks the protocol from the path below it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from http import HTTPStatus
from typing import Any

from flask import Flask, Response, jsonify, request
from werkzeug.exceptions import HTTPException
from werkzeug.wsgi import get_input_stream

from polar.codec.http_requests import Refused
from polar.codec.instance import instance_headers
from polar.codec.json_body import dump_json
from polar.config import Config, load_config
from polar.contract.proxy_routes import api_key, first_args, route
from polar.errors import PolarError, ValidationError
from polar.fleet.overview import engine_pool
from polar.observability import ProxyMetrics, exposition
from polar.protocols import detect, protocol_for_errors
from polar.proxy import ProxyAnswer, ProxyService
from polar.proxy.body_limits import FOR_THIS_API, body_cap, check_length, request_cap
from polar.storage.database import open_database
from web.http1 import ClientGone
from web.json_provider import FastJSONProvider
from web.proxy.delivery import client_gone, watched

METHODS = ("GET", "POST", "HEAD")
# The routes Flask serves; every other path is a model call (``ProxyApp.wsgi_app``).
FLASK_PATHS = frozenset(("/healthz", "/metrics"))
_STATUS_LINES = {status.value: f"{status.value} {status.phrase}" for status in HTTPStatus}
StartResponse = Callable[..., Any]


class ModelCallRequest:
    """What a model call's answer depends on, read off its WSGI environ: the method, the path below the session's
    base (``/s/<key>`` or ``/s/<key>/a/<agent>``, or none when the key comes as an API key), the key, the agent
    label, the header fields (lower-case names), the query's first values, the peer address it came from
    (``source``: whose budget an unknown key's lookup spends, ``polar.proxy.key_misses``), and how to read the
    body."""

    __slots__ = ("agent", "args", "environ", "headers", "key", "method", "path", "source")

    def __init__(self, environ: dict[str, Any]) -> None:
        self.environ = environ
        self.method: str = environ["REQUEST_METHOD"]
        self.source: str | None = environ.get("REMOTE_ADDR") or None
        self.key, self.agent, self.path = route(environ["PATH_INFO"])
        self.headers = headers = _headers(environ)
        self.args = first_args(environ.get("QUERY_STRING", ""))
        self.agent = self.agent or headers.get("x-polar-agent") or None
        self.key = self.key or api_key(headers, self.args)

    def reader(self, cap: int, what: str = FOR_THIS_API) -> Callable[[], bytes]:
        """How to read the body, refusing one over ``cap`` bytes (413, naming the limit: ``what``) before reading it
        when it says its length, else once it passes the cap."""

        def read() -> bytes:
            length = self.headers.get("content-length")
            check_length(int(length) if length and length.isdigit() else None, cap, what)
            # At most one byte past the cap, chunked or not: a body over it is refused, never held whole.
            try:
                data = get_input_stream(self.environ, max_content_length=None).read(cap + 1)
            except Refused as exc:  # a chunk the parser refused: the caller's fault, answered in its protocol
                raise ValidationError(f"malformed request body: {exc.reason}") from None
            except ClientGone as exc:  # no answer reaches it; counted as the client's, not as a server error
                raise ValidationError(f"the request body did not arrive: {exc}") from None
            check_length(len(data), cap, what)
            return data

        return read


def _headers(environ: dict[str, Any]) -> dict[str, str]:
    """A request's header fields by lower-case name, from its WSGI environ."""
    headers = {name[5:].replace("_", "-").lower(): value for name, value in environ.items()
               if name.startswith("HTTP_")}  # fmt: skip
    for name in ("CONTENT_TYPE", "CONTENT_LENGTH"):
        if environ.get(name):
            headers[name.replace("_", "-").lower()] = environ[name]
    return headers


def _unrouted(metrics: ProxyMetrics, path: str, headers: dict[str, str], status: int, message: str) -> ProxyAnswer:
    """An answer no engine call stands behind (no route, a method no protocol has, a bug), in the error shape of the
    protocol the request looks like, counted."""
    protocol = protocol_for_errors(path, headers)
    metrics.answered(protocol.PROVIDER, "unknown", status)
    return ProxyAnswer(status, protocol.render_error(status, message))


def _answer(service: ProxyService, call: ModelCallRequest) -> ProxyAnswer:
    if call.method not in METHODS:
        message = f"method {call.method} is not allowed here"
        return _unrouted(service.metrics, call.environ["PATH_INFO"], call.headers, 405, message)
    found = detect(call.method, call.path, call.headers, call.args)
    if found is None and call.method == "POST":
        # No route by path: the body may say which API it is; it is read only for a live session's key.
        protocol = protocol_for_errors(call.path, call.headers)
        try:
            read = call.reader(body_cap(protocol, service.config.max_body_bytes))
            sniffed = service.body_for_routing(call.key, read, call.source)
        except PolarError as exc:  # over the cap, or no slot free
            refused = service.error(protocol, exc)
            service.metrics.answered(protocol.PROVIDER, "unknown", refused.status)
            return refused
        if sniffed is not None:
            raw, body = sniffed
            found = detect(call.method, call.path, call.headers, call.args, body)
            if found is not None:
                return service.handle(found, call.key, call.agent, raw, call.source)
    if found is None:
        message = f"no such route: {call.method} /{call.path.strip('/')}"
        return _unrouted(service.metrics, call.path, call.headers, 404, message)
    cap, what = request_cap(found.protocol, found.operation, service.config)  # counting tokens: a smaller cap
    return service.handle(found, call.key, call.agent, call.reader(cap, what), call.source)


def _respond(
    service: ProxyService, answer: ProxyAnswer, environ: dict[str, Any], start_response: StartResponse
) -> Iterable[bytes]:
    """``answer`` as the WSGI server sends it: JSON (as ``jsonify`` writes it), or a stream that marks its call
    undelivered when it is cut; a call whose client left before its answer is marked at once."""
    stream = answer.stream
    if answer.call_id is not None:
        call_id = answer.call_id
        if client_gone(environ):
            service.mark_undelivered(call_id, "the client had closed its connection")
        elif stream is not None:
            stream = watched(stream, lambda: service.mark_undelivered(call_id, "the stream was cut before its end"))
    status = _STATUS_LINES.get(answer.status) or f"{answer.status} Unknown"
    if stream is not None:
        media_type = answer.media_type
        if media_type.startswith("text/") and "charset" not in media_type:
            media_type += "; charset=utf-8"
        start_response(status, [("Content-Type", media_type), ("Cache-Control", "no-cache"),
                                ("X-Accel-Buffering", "no"), *answer.headers.items()])  # fmt: skip
        return stream
    body = dump_json(answer.body) + b"\n"
    start_response(status, [("Content-Type", "application/json"), ("Content-Length", str(len(body))),
                            *answer.headers.items()])  # fmt: skip
    return [body]


class ProxyApp(Flask):
    """The proxy's Flask app. Model calls (every path but ``FLASK_PATHS``) go from the WSGI environ straight to the
    service, past Flask's request context, routing and response objects: on a small call those cost about as much
    CPU as the serving itself (docs/benchmarks.md). They answer in the caller's protocol whatever happens, a bug
    included (a 500 in its error shape, never HTML)."""

    def wsgi_app(self, environ: dict[str, Any], start_response: StartResponse) -> Any:
        if environ["PATH_INFO"] in FLASK_PATHS:
            return super().wsgi_app(environ, start_response)
        service: ProxyService = self.extensions["polar_proxy"]
        try:
            call = ModelCallRequest(environ)
            return _respond(service, _answer(service, call), environ, start_response)
        except Exception as exc:
            self.logger.exception("unhandled proxy error")
            message = f"internal proxy error: {type(exc).__name__}"
            answer = _unrouted(service.metrics, environ["PATH_INFO"], _headers(environ), 500, message)
            return _respond(service, answer, environ, start_response)


def create_app(config: Config | None = None) -> Flask:
    config = config or load_config()
    app = ProxyApp(__name__)
    app.json = FastJSONProvider(app)
    metrics = ProxyMetrics()
    db = open_database(config, "proxy")
    app.extensions["polar_proxy"] = ProxyService(config, db, engine_pool(config, db, metrics), metrics=metrics)

    @app.get("/healthz")
    def healthz() -> tuple[Response, int, dict[str, str]]:
        return jsonify({"status": "ok"}), 200, instance_headers()

    @app.get("/metrics")
    def prometheus() -> Response:
        # Open, like the engines' own /metrics: aggregates only (docs/metrics.md).
        body, content_type = exposition(metrics.registry)
        return Response(body, content_type=content_type)

    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException) -> tuple[Response, int]:
        status = exc.code or 500
        answer = _unrouted(metrics, request.path, _headers(request.environ), status, exc.description or exc.name)
        return jsonify(answer.body), status

    @app.errorhandler(Exception)
    def unexpected(exc: Exception) -> tuple[Response, int]:
        app.logger.exception("unhandled proxy error")
        message = f"internal proxy error: {type(exc).__name__}"  # a bug still answers in the caller's error shape
        return jsonify(_unrouted(metrics, request.path, _headers(request.environ), 500, message).body), 500

    return app
