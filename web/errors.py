"""The rollout API's one error shape, with the status ``polar.errors.http_status`` gives each error:
``{"error": {"message", "status", "field"?}}`` (``ErrorJSON``, the error schema of ``/openapi.json``)."""

from __future__ import annotations

import logging
from typing import NotRequired

from flask import Flask, Response, jsonify
from pydantic import ConfigDict, with_config
from typing_extensions import TypedDict  # pydantic reads TypedDicts from typing_extensions on Python < 3.12
from werkzeug.exceptions import HTTPException

from polar.errors import Busy, PolarError, http_status

log = logging.getLogger(__name__)


@with_config(ConfigDict(extra="forbid"))
class ErrorDetailJSON(TypedDict):
    message: str  # what is wrong, worded for the caller
    status: int  # the HTTP status again
    field: NotRequired[str]  # the offending field, e.g. tasks[0].harness.name, when there is one


@with_config(ConfigDict(extra="forbid"))
class ErrorJSON(TypedDict):
    error: ErrorDetailJSON


def error_body(status: int, message: str, field: str | None = None) -> tuple[Response, int]:
    error: ErrorDetailJSON = {"message": message, "status": status}
    if field:
        error["field"] = field
    body: ErrorJSON = {"error": error}
    return jsonify(body), status


def register_error_handlers(app: Flask) -> None:
    @app.errorhandler(PolarError)
    def _polar(exc: PolarError) -> tuple[Response, int]:
        status = http_status(exc)
        response, status = error_body(status, str(exc), getattr(exc, "field", None))
        if isinstance(exc, Busy):
            response.headers["Retry-After"] = str(exc.retry_after_s)
        return response, status

    @app.errorhandler(HTTPException)
    def _http(exc: HTTPException) -> tuple[Response, int]:
        response, status = error_body(exc.code or 500, exc.description or exc.name)
        # Werkzeug's own headers (a 405's Allow, which RFC 9110 requires) stay; the body is ours
        response.headers.extend([(k, v) for k, v in exc.get_headers() if k.lower() != "content-type"])
        return response, status

    @app.errorhandler(Exception)
    def _unexpected(exc: Exception) -> tuple[Response, int]:
        log.exception("unhandled error")
        return error_body(500, f"internal error: {type(exc).__name__}")
