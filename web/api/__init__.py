"""The rollout API (DESIGN.md §3): ``gunicorn 'web.api:create_app()'``.

One blueprint per resource; views parse, call ``polar``, serialise.
"""

from __future__ import annotations

import hmac

from flask import Flask, current_app, request

from polar.config import Config, load_config
from polar.errors import Unauthorized
from web.api import batches, engine, exports, health, sessions, trajectories
from web.errors import register_error_handlers
from web.services import web_services

OPEN_PATHS = frozenset({"/healthz"})


def _authenticate() -> None:
    token = current_app.config["POLAR"].api_token
    if not token or request.path in OPEN_PATHS:
        return
    supplied = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
    if not hmac.compare_digest(supplied.encode(), token.encode()):
        raise Unauthorized("missing or wrong bearer token (Authorization: Bearer <POLAR_API_TOKEN>)")


def create_app(config: Config | None = None) -> Flask:
    config = config or load_config()
    app = Flask(__name__)
    app.config["POLAR"] = config
    app.config["MAX_CONTENT_LENGTH"] = config.max_body_bytes
    app.extensions["polar"] = web_services(config, "api")
    app.json.sort_keys = False  # type: ignore[attr-defined]
    app.before_request(_authenticate)
    register_error_handlers(app)
    for blueprint in (
        batches.blueprint,
        sessions.blueprint,
        exports.blueprint,
        health.blueprint,
        trajectories.blueprint,
        engine.blueprint,
    ):
        app.register_blueprint(blueprint)
    return app
