"""The console's pages. Each view parses its arguments, calls one or two ``polar`` reads, and renders a template:

/ui/                          batches, newest first (paged: ?offset=)
/ui/batches/<id>              progress, per task and per node, reward histograms, acceptance, sessions
/ui/sessions/<id>             facts, timeline of session_events, segments, trajectories, calls (paged: ?calls=)
/ui/calls/<id>                one call in full, its images shown
/ui/media/<sha256>            an image a call sent (for the call page)
/ui/trajectories/<id>         the trajectory viewer (paged: ?page=, PAGE_TOKENS tokens a page)
"""

from __future__ import annotations

import math

from flask import Response, current_app, render_template, request

from polar.contract.states import TERMINAL
from polar.errors import ValidationError
from polar.inspection import (
    PAGE_TOKENS,
    TokenText,
    batch_overview,
    call_page,
    get_call,
    list_batches,
    load_trajectory,
    page_window,
    segment_tree,
    session_timeline,
    trajectory_page,
    trajectory_summaries,
)
from polar.inspection.overview import STATES
from polar.lifecycle.batches import batch_status
from polar.lifecycle.sessions import get_session, list_sessions
from polar.storage.serialization import batch_json
from web.api.requests import int_arg, parse_id, services
from web.console.blueprint import blueprint

BATCHES_PER_PAGE = 50
SESSIONS_PER_PAGE = 100
TASKS_PER_PAGE = 50
CALLS_PER_PAGE = 20
TOKEN_TEXT = "polar.console.token_text"  # app.extensions key of the app's TokenText
REFRESH_S = 5  # a page of a batch or session still moving reloads itself this often


@blueprint.context_processor
def _refresh() -> dict[str, int]:
    return {"REFRESH_S": REFRESH_S}


def _offset(name: str) -> int:
    return int_arg(name, 0, 0, 10**9)


def _min_reward() -> float | None:
    raw = request.args.get("min_reward", "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise ValidationError(f"min_reward: must be a number, got {raw!r}", field="min_reward") from None
    if not math.isfinite(value):
        raise ValidationError("min_reward: must be a finite number", field="min_reward")
    return value


@blueprint.get("/", strict_slashes=False)
def batches() -> str:
    page = list_batches(services(), limit=BATCHES_PER_PAGE, offset=_offset("offset"))
    return render_template("console/batches.html", page=page, offset=_offset("offset"), per_page=BATCHES_PER_PAGE,
                           states=STATES)  # fmt: skip


@blueprint.get("/batches/<batch_id>")
def batch(batch_id: str) -> str:
    identifier = parse_id(batch_id, "batch")
    status = batch_status(services(), identifier)
    summary = batch_json(status["batch"], status["status"], status["counts"], status["attempts"])
    overview = batch_overview(services(), identifier, _min_reward())
    sessions = list_sessions(services(), identifier, limit=SESSIONS_PER_PAGE, offset=_offset("offset"))
    return render_template(
        "console/batch.html",
        batch=summary,
        overview=overview,
        sessions=sessions,
        offset=_offset("offset"),
        per_page=SESSIONS_PER_PAGE,
        task_offset=_offset("tasks"),
        tasks_per_page=TASKS_PER_PAGE,
        states=STATES,
        live=summary["status"] != "finished",
    )


@blueprint.get("/sessions/<session_id>")
def session_page(session_id: str) -> str:
    identifier = parse_id(session_id, "session")
    session = get_session(services(), identifier)
    trajectories = trajectory_summaries(services(), identifier)
    return render_template(
        "console/session.html",
        session=session,
        live=session["state"] not in TERMINAL,
        timeline=session_timeline(services(), identifier),
        trajectories=trajectories,
        segment_tree=segment_tree(trajectories),
        calls=call_page(services(), identifier, offset=_offset("calls"), limit=CALLS_PER_PAGE),
        calls_offset=_offset("calls"),
        calls_per_page=CALLS_PER_PAGE,
    )


@blueprint.get("/calls/<call_id>")
def call(call_id: str) -> str:
    return render_template("console/call.html", call=get_call(services(), parse_id(call_id, "call")))


@blueprint.get("/media/<sha256>")
def media(sha256: str) -> Response:
    from web.api.media import image  # the API's view: the console's login guards it here

    return image(sha256)


@blueprint.get("/trajectories/<trajectory_id>")
def trajectory(trajectory_id: str) -> str:
    detail = load_trajectory(services(), parse_id(trajectory_id, "trajectory"))
    window = page_window(len(detail.token_ids), int_arg("page", 1, 1, 10**9))
    on_page = detail.token_ids[window.start : window.end]
    marked = [t for m in detail.breaks for t in (m.expected_token, m.actual_token) if t is not None]
    token_text: TokenText = current_app.extensions[TOKEN_TEXT]
    decoded = token_text.decode(detail.session_id, [*on_page, *marked])
    page = trajectory_page(detail, window, decoded.texts)
    return render_template("console/trajectory.html", detail=detail, page=page, decoded=decoded,
                           page_tokens=PAGE_TOKENS)  # fmt: skip
