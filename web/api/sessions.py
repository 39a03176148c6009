"""``/v1/sessions/<id>``: one session, its state changes, its captured calls, its trajectories."""

from __future__ import annotations

from flask import Blueprint, Response, jsonify

from polar.inspection.timeline import events_json, session_timeline
from polar.lifecycle.sessions import call_page, get_session, session_trajectories
from web.api.requests import IntArg, parse_id, services

blueprint = Blueprint("sessions", __name__, url_prefix="/v1/sessions")

# Every call carries the conversation so far (requests of hundreds of KB at agent size): pages stay small.
CALLS_LIMIT = IntArg("limit", 50, 1, 1000)
CALLS_AFTER = IntArg("after", 0, 0, 2**31 - 1)


@blueprint.get("/<session_id>")
def show(session_id: str) -> Response:
    return jsonify(get_session(services(), parse_id(session_id, "session")))


@blueprint.get("/<session_id>/events")
def events(session_id: str) -> Response:
    session = parse_id(session_id, "session")
    return jsonify(events_json(session, session_timeline(services(), session)))


@blueprint.get("/<session_id>/calls")
def calls(session_id: str) -> Response:
    session = parse_id(session_id, "session")
    return jsonify(call_page(services(), session, after=CALLS_AFTER.read(), limit=CALLS_LIMIT.read()))


@blueprint.get("/<session_id>/trajectories")
def trajectories(session_id: str) -> Response:
    return jsonify({"items": session_trajectories(services(), parse_id(session_id, "session"))})
