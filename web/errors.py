"""The one place that maps Polar's errors to HTTP status codes for the rollout API."""

from __future__ import annotations

import logging

from flask import Flask, Response, jsonify
from werkzeug.exceptions import HTTPException

from polar.errors import Busy, Conflict, Forbidden, NotFound, PolarError, Unauthorized, ValidationError

log = logging.getLogger(__name__)

STATUS: dict[type[PolarError], int] = {
    ValidationError: 400, Unauthorized: 401, Forbidden: 403, NotFound: 404, Conflict: 409, Busy: 429,
}  # fmt: skip


def error_body(status: int, message: str, field: str | None = None) -> tuple[Response, int]:
    error: dict[str, object] = {"message": message, "status": status}
    if field:
        error["field"] = field
    return jsonify({"error": error}), status


def register_error_handlers(app: Flask) -> None:
    @app.errorhandler(PolarError)
    def _polar(exc: PolarError) -> tuple[Response, int]:
        status = next((code for kind, code in STATUS.items() if isinstance(exc, kind)), 500)
        response, status = error_body(status, str(exc), getattr(exc, "field", None))
        if isinstance(exc, Busy):
            response.headers["Retry-After"] = str(exc.retry_after_s)
        return response, status

    @app.errorhandler(HTTPException)
    def _http(exc: HTTPException) -> tuple[Response, int]:
        return error_body(exc.code or 500, exc.description or exc.name)

    @app.errorhandler(Exception)
    def _unexpected(exc: Exception) -> tuple[Response, int]:
        log.exception("unhandled error")
        return error_body(500, f"internal error: {type(exc).__name__}")
