"""``GET /v1/media/<sha256>``: an image a captured call sent, by the sha256 a trajectory's ``media`` names
(``polar.storage.media``); read like the feed (the API token or the read-only one)."""

from __future__ import annotations

import re

from flask import Blueprint, Response

from polar.errors import NotFound, ValidationError
from polar.storage.media import load
from web.api.requests import services

blueprint = Blueprint("media", __name__, url_prefix="/v1/media")

_SHA256 = re.compile(r"[0-9a-f]{64}")


@blueprint.get("/<sha256>")
def image(sha256: str) -> Response:
    if _SHA256.fullmatch(sha256) is None:
        raise ValidationError("sha256: must be 64 lower-case hex digits", field="sha256")
    with services().db.engine.connect() as connection:
        found = load(connection, [sha256]).get(sha256)
    if found is None:
        raise NotFound(f"no image {sha256} is stored here")
    # Content-addressed: the bytes under a name never change.
    headers = {"Cache-Control": "private, max-age=31536000, immutable", "ETag": f'"{sha256}"'}
    return Response(found.data, mimetype=found.media_type, headers=headers)
