"""``/v1/trajectories``: the trainers' feed, a long-poll behind a cursor (``polar.training.feed``)."""

from __future__ import annotations

from flask import Blueprint, Response, current_app, jsonify

from polar.codec.wait_slots import WaitSlots
from polar.errors import ValidationError
from polar.training.feed import wait_for_feed
from web.api.requests import IntArg, parse_id, query_arg, services

blueprint = Blueprint("trajectories", __name__, url_prefix="/v1/trajectories")

MAX_WAIT_S = 60.0
FEED_AFTER = IntArg("after", 0, 0, 2**62)
FEED_LIMIT = IntArg("limit", 100, 1, 1000)
GROUPS_VALUES = frozenset({"true", "false", "1", "0"})  # compared lower-cased


def _wait() -> float:
    raw = query_arg("wait", "0") or ""
    try:
        wait = float(raw)
    except ValueError:
        raise ValidationError(f"wait: must be a number of seconds, got {raw!r}", field="wait") from None
    if not 0 <= wait <= MAX_WAIT_S:
        raise ValidationError(f"wait: must be between 0 and {MAX_WAIT_S:g} seconds", field="wait")
    return wait


def _groups() -> bool:
    return _flag("groups")


def _slots() -> WaitSlots:
    # One bound per app (process); setdefault keeps the first if two threads race to create it.
    limit = services().config.feed_max_waiters
    return current_app.extensions.setdefault("polar_feed_waiters", WaitSlots(limit))  # type: ignore[no-any-return]


def _flag(name: str) -> bool:
    raw = (query_arg(name, "false") or "").lower()
    if raw not in GROUPS_VALUES:
        raise ValidationError(f"{name}: must be true or false", field=name)
    return raw in {"true", "1"}


@blueprint.get("")
def feed() -> Response:
    batch = query_arg("batch_id")
    informative = _flag("informative")
    groups = _groups() or informative  # it leaves out whole groups: it serves whole groups
    page = wait_for_feed(
        services(),
        None if batch is None else parse_id(batch, "batch"),  # an empty batch_id is no batch, not "every batch"
        after=FEED_AFTER.read(),
        limit=FEED_LIMIT.read(),
        groups=groups,
        wait_s=_wait(),
        slots=_slots(),
        informative=informative,
    )
    body = {"items": page.fragments, "next_cursor": page.next_cursor}
    if informative:
        body["skipped_uninformative"] = page.skipped_uninformative
    return jsonify(body)
