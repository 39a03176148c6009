"""``/v1/engine``: hold model calls while a trainer syncs weights, then resume with a new policy version."""

from __future__ import annotations

import dataclasses

from flask import Blueprint, Response, jsonify, request

from polar.errors import ValidationError
from polar.json_body import parse_json
from polar.records.audit import record_now
from polar.training.engine_control import read_state, set_state
from web.api.auth import caller
from web.api.requests import services

blueprint = Blueprint("engine", __name__, url_prefix="/v1/engine")


def _options() -> tuple[str, str | None]:
    body = parse_json(request.get_data(cache=True)) if request.content_length else {}
    if not isinstance(body, dict):
        raise ValidationError("request body must be a JSON object")
    unknown = set(body) - {"mode", "policy_version"}
    if unknown:
        raise ValidationError(f"{sorted(unknown)[0]}: unknown field", field=sorted(unknown)[0])
    version = body.get("policy_version")
    if version is not None and not isinstance(version, str | int):
        raise ValidationError("policy_version: must be a string or an integer", field="policy_version")
    mode = body.get("mode", "reject")
    return str(mode), None if version is None else str(version)


@blueprint.get("")
def show() -> Response:
    return jsonify(dataclasses.asdict(read_state(services().db)))


@blueprint.post("/pause")
def pause() -> Response:
    mode, version = _options()
    state = dataclasses.asdict(set_state(services().db, True, mode, version))
    record_now(services().db, caller(), "pause", "engine", state)
    return jsonify(state)


@blueprint.post("/resume")
def resume() -> Response:
    _mode, version = _options()
    state = dataclasses.asdict(set_state(services().db, False, "reject", version))
    record_now(services().db, caller(), "resume", "engine", state)
    return jsonify(state)
