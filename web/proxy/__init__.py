"""The model-API proxy (DESIGN.md §4): ``gunicorn -k web.gunicorn_worker.EpollWorker 'web.proxy:create_app()'``.

Base URL per session: ``/s/<key>``, optionally ``/s/<key>/a/<agent>``; the key is also accepted as any
provider's API key on un-prefixed paths. ``polar.protocols.detect`` picks the protocol from the path below it.
"""

from __future__ import annotations

from collections.abc import Callable

from flask import Flask, Response, current_app, jsonify, request, stream_with_context
from werkzeug.exceptions import HTTPException

from polar.config import Config, load_config
from polar.errors import PolarError
from polar.instance import instance_headers
from polar.observability import ProxyMetrics, exposition
from polar.protocols import detect, protocol_for_errors
from polar.proxy import ProxyAnswer, ProxyService
from polar.proxy.body_limits import body_cap, check_length
from polar.proxy.fleet import engine_pool
from polar.storage.database import open_database
from web.json_provider import FastJSONProvider
from web.proxy.delivery import client_gone, watched

KEY_HEADERS = ("x-api-key", "x-goog-api-key")


def _service() -> ProxyService:
    return current_app.extensions["polar_proxy"]  # type: ignore[no-any-return]


def _key_from_request() -> str | None:
    bearer = request.headers.get("Authorization", "")
    if bearer.lower().startswith("bearer "):
        return bearer[7:].strip() or None
    for header in KEY_HEADERS:
        if request.headers.get(header):
            return request.headers[header]
    return request.args.get("key")


def _respond(answer: ProxyAnswer) -> Response:
    stream = answer.stream
    if answer.call_id is not None:
        call_id, service = answer.call_id, _service()
        if client_gone(request.environ):
            service.mark_undelivered(call_id, "the client had closed its connection")
        elif stream is not None:
            stream = watched(stream, lambda: service.mark_undelivered(call_id, "the stream was cut before its end"))
    if stream is not None:
        response = Response(stream_with_context(stream), status=answer.status, mimetype=answer.media_type)
        response.headers["Cache-Control"] = "no-cache"
        response.headers["X-Accel-Buffering"] = "no"
        response.headers.update(answer.headers)
        return response
    response = jsonify(answer.body)
    response.status_code = answer.status
    response.headers.update(answer.headers)
    return response


def _reader(cap: int) -> Callable[[], bytes]:
    """How to read this request's body, refusing one over ``cap`` bytes (413) before reading it when it says its
    length, else once it passes the cap."""

    def read() -> bytes:
        check_length(request.content_length, cap)
        data = request.get_data(cache=False)
        check_length(len(data), cap)
        return data

    return read


def _handle(key: str | None, agent: str | None, path: str) -> Response:
    agent = agent or request.headers.get("X-Polar-Agent") or None
    headers = {name.lower(): value for name, value in request.headers.items()}
    key = key or _key_from_request()
    service = _service()
    found = detect(request.method, path, headers, request.args.to_dict())
    if found is None and request.method == "POST":
        # No route by path: the body may say which API it is; it is read only for a live session's key.
        protocol = protocol_for_errors(path, headers)
        try:
            sniffed = service.body_for_routing(key, _reader(body_cap(protocol, service.config.max_body_bytes)))
        except PolarError as exc:  # over the cap, or no slot free
            refused = service.error(protocol, exc)
            service.metrics.answered(protocol.PROVIDER, "unknown", refused.status)
            return _respond(refused)
        if sniffed is not None:
            raw, body = sniffed
            found = detect(request.method, path, headers, request.args.to_dict(), body)
            if found is not None:
                return _respond(service.handle(found, key, agent, raw))
    if found is None:
        protocol = protocol_for_errors(path, headers)
        body = protocol.render_error(404, f"no such route: {request.method} /{path.strip('/')}")
        service.metrics.answered(protocol.PROVIDER, "unknown", 404)
        return _respond(ProxyAnswer(404, body))
    return _respond(service.handle(found, key, agent, _reader(body_cap(found.protocol, service.config.max_body_bytes))))


def create_app(config: Config | None = None) -> Flask:
    config = config or load_config()
    app = Flask(__name__)
    app.json = FastJSONProvider(app)
    app.config["MAX_CONTENT_LENGTH"] = config.max_body_bytes
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

    methods = ["GET", "POST", "HEAD"]

    @app.route("/s/<key>/a/<agent>/", defaults={"path": ""}, methods=methods)
    @app.route("/s/<key>/a/<agent>/<path:path>", methods=methods)
    def with_agent(key: str, agent: str, path: str) -> Response:
        return _handle(key, agent, path)

    @app.route("/s/<key>/", defaults={"path": ""}, methods=methods)
    @app.route("/s/<key>/<path:path>", methods=methods)
    def with_key(key: str, path: str) -> Response:
        return _handle(key, None, path)

    @app.route("/", defaults={"path": ""}, methods=methods)
    @app.route("/<path:path>", methods=methods)
    def bare(path: str) -> Response:
        return _handle(None, None, path)

    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException) -> tuple[Response, int]:
        status = exc.code or 500
        headers = {name.lower(): value for name, value in request.headers.items()}
        protocol = protocol_for_errors(request.path, headers)
        metrics.answered(protocol.PROVIDER, "unknown", status)
        return jsonify(protocol.render_error(status, exc.description or exc.name)), status

    @app.errorhandler(Exception)
    def unexpected(exc: Exception) -> tuple[Response, int]:
        app.logger.exception("unhandled proxy error")
        headers = {name.lower(): value for name, value in request.headers.items()}
        protocol = protocol_for_errors(request.path, headers)  # a bug still answers in the caller's error shape
        metrics.answered(protocol.PROVIDER, "unknown", 500)
        return jsonify(protocol.render_error(500, f"internal proxy error: {type(exc).__name__}")), 500

    return app
