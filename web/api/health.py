"""``/healthz``: liveness, including a round trip to the database."""

from __future__ import annotations

import sqlalchemy as sa
from flask import Blueprint, Response, jsonify

from polar.codec.instance import instance_headers
from web.api.requests import services

blueprint = Blueprint("health", __name__)


@blueprint.get("/healthz")
def healthz() -> tuple[Response, int, dict[str, str]]:
    try:
        with services().db.unit() as db:
            db.execute(sa.text("SELECT 1"))
    except sa.exc.SQLAlchemyError as exc:
        return jsonify({"status": "unavailable", "database": str(exc.__class__.__name__)}), 503, instance_headers()
    return jsonify({"status": "ok"}), 200, instance_headers()
