"""The rollout API (DESIGN.md §3): ``gunicorn 'web.api:create_app()'``.

One blueprint per resource; views parse, call ``polar``, serialise. ``web.api.auth`` says who may call what; the
app is never created without ``POLAR_API_TOKEN``. The web console (``web.console``) is served under ``/ui/``.
"""

from __future__ import annotations

from flask import Flask

from polar.config import Config, load_config
from web.api import batches, engine, engines, exports, health, media, metrics, openapi, sessions, trajectories
from web.api.auth import require_tokens
from web.errors import register_error_handlers
from web.json_provider import FastJSONProvider
from web.services import web_services


def create_app(config: Config | None = None) -> Flask:
    """The API for ``config`` (default: the environment); raises ``ValidationError`` without a proper token."""
    config = config or load_config()
    app = Flask(__name__)
    # ``/v1/batches//sessions`` (an empty id) is a 404, not a 308 to ``/v1/batches/sessions``: a client that lost an
    # id must hear so, not be redirected to another route.
    app.url_map.merge_slashes = False
    require_tokens(app, config)  # first: nothing is opened (database, broker) for an app that must not start
    app.config["POLAR"] = config
    app.config["MAX_CONTENT_LENGTH"] = config.max_body_bytes
    app.extensions["polar"] = web_services(config, "api")
    app.json = FastJSONProvider(app)
    register_error_handlers(app)
    for blueprint in (
        batches.blueprint,
        sessions.blueprint,
        exports.blueprint,
        health.blueprint,
        trajectories.blueprint,
        engine.blueprint,
        engines.blueprint,
        media.blueprint,
    ):
        app.register_blueprint(blueprint)
    from web.console import register_console  # here: web.console imports web.api.auth

    register_console(app)  # the web console at /ui/ (docs/console.md)
    metrics.install(app, config)  # /metrics, and every request counted
    openapi.install(app)  # /openapi.json, without a token (docs/api.md)
    return app
