"""Attaching the console to the rollout API app: ``register_console(app)`` after the API's own setup."""

from __future__ import annotations

import logging

from flask import Flask, Response, render_template, request
from werkzeug.exceptions import HTTPException

from polar.errors import PolarError, http_status
from polar.fleet.engines import EnginePool
from polar.inspection import TokenText
from web.api.auth import app_tokens, authenticates_itself
from web.console import login, pages
from web.console.blueprint import blueprint
from web.console.formatting import FILTERS, GLOBALS

log = logging.getLogger(__name__)

# Pages load nothing from elsewhere and run no inline script: model output that slipped past escaping could not
# run either, and the test fails on any violation (it is reported as a console error).
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}
DETOKENIZE_TIMEOUT_S = 5.0


def register_console(app: Flask) -> None:
    """Serve the console under ``/ui`` on ``app`` (the API: its tokens, services and configuration)."""
    login.configure_sessions(app, app_tokens(app))
    authenticates_itself(app, blueprint.name)
    config = app.extensions["polar"].config
    engines = EnginePool(config.engine_urls, timeout_s=DETOKENIZE_TIMEOUT_S, max_connections=16)
    app.extensions[pages.TOKEN_TEXT] = TokenText(engines)
    app.jinja_env.filters.update(FILTERS)
    app.jinja_env.globals.update(GLOBALS)
    app.register_blueprint(blueprint)


@blueprint.after_request
def _headers(response: Response) -> Response:
    response.headers.update(SECURITY_HEADERS)
    if request.endpoint != "console.static":
        response.headers["Cache-Control"] = "no-store"  # pages show training data: keep them out of caches
    return response


def _error_page(status: int, message: str) -> tuple[str, int]:
    return render_template("console/error.html", status=status, message=message), status


@blueprint.errorhandler(PolarError)
def _polar_error(exc: PolarError) -> tuple[str, int]:
    status = http_status(exc)
    return _error_page(status, str(exc))


@blueprint.errorhandler(HTTPException)
def _http_error(exc: HTTPException) -> tuple[str, int]:
    return _error_page(exc.code or 500, exc.description or exc.name)


@blueprint.errorhandler(Exception)
def _unexpected(exc: Exception) -> tuple[str, int]:
    log.exception("console page failed")
    return _error_page(500, f"internal error: {type(exc).__name__}")
