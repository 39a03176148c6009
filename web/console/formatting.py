"""How the console writes values: durations, rewards, JSON, token cells, the geometry of its SVG bars, and the
URLs of other pages of a paged list.

Registered as Jinja filters and globals by ``web.console.registration``. Everything returns plain text; Jinja's
autoescaping makes it safe in HTML (never mark anything here ``Markup``: it may hold model output).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from flask import request, url_for

from polar.inspection.trajectory_view import TokenCell

JSON_SHOWN_CHARS = 65_536  # per JSON block on a page of calls; the call's own page shows everything
DASH = "—"


def duration(seconds: float | None) -> str:
    """``0.42 s``, ``12.3 s``, ``4 m 05 s``, ``2 h 07 m``."""
    if seconds is None or not math.isfinite(seconds):
        return DASH
    if seconds < 10:
        return f"{seconds:.2f} s"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} m {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} m"


def number(value: float | None, digits: int = 3) -> str:
    if value is None:
        return DASH
    return f"{value:.{digits}g}" if isinstance(value, float) else str(value)


def percent(value: float | None) -> str:
    return DASH if value is None else f"{100 * value:.0f}%"


def moment(value: str | datetime | None) -> str:
    """An ISO timestamp as ``2026-11-23 12:34:56`` (UTC), to the second."""
    if value is None:
        return DASH
    parsed = value if isinstance(value, datetime) else datetime.fromisoformat(value)
    return parsed.strftime("%Y-%m-%d %H:%M:%S")


def short(identifier: object) -> str:
    return str(identifier)[:8]


def pretty_json(value: Any, limit: int | None = JSON_SHOWN_CHARS) -> str:
    text = json.dumps(value, indent=2, ensure_ascii=False, default=str)
    if limit is not None and len(text) > limit:
        return f"{text[:limit]}\n… ({len(text) - limit:,} more characters: open the call's own page)"
    return text


def quoted(text: str | None) -> str:
    """A decoded text in double quotes with its escapes visible (``"\\n"``), or a dash."""
    return DASH if text is None else json.dumps(text, ensure_ascii=False)


def token_text(cell: TokenCell) -> str:
    """What a token shows: its decoded text, or its id in angle brackets when it was not decoded."""
    return cell.text if cell.text is not None else f"⟨{cell.token_id}⟩"


def token_title(cell: TokenCell) -> str:
    """The hover text: position, id, and for a sampled token its logprob and probability."""
    head = f"#{cell.index} · id {cell.token_id}"
    if not cell.sampled:
        return f"{head} · prompt (mask 0)"
    return f"{head} · logprob {cell.logprob:.4f} · p {math.exp(cell.logprob):.3f}"


def segments(parts: Iterable[tuple[str, float | int | None]]) -> list[dict[str, Any]]:
    """Stacked-bar geometry in percent of the whole: ``name``, ``value``, ``x``, ``width`` per non-empty part."""
    values = [(name, float(value)) for name, value in parts if value and value > 0]
    total = sum(value for _, value in values)
    shown, x = [], 0.0
    for name, value in values:
        width = 100 * value / total
        shown.append({"name": name, "value": value, "x": round(x, 3), "width": round(width, 3)})
        x += width
    return shown


def state_segments(counts: Mapping[str, int], order: Iterable[str]) -> list[dict[str, Any]]:
    """``segments`` of sessions per state, in pipeline order."""
    return segments((state, counts.get(state, 0)) for state in order)


def page_url(**changes: object) -> str:
    """This page's URL with the query arguments ``changes`` set (others kept; a None value drops one)."""
    args = {**request.args.to_dict(), **changes}
    kept: dict[str, Any] = {name: value for name, value in args.items() if value is not None}
    return url_for(str(request.endpoint), **(request.view_args or {}), **kept)


FILTERS = {
    "duration": duration,
    "number": number,
    "percent": percent,
    "moment": moment,
    "short": short,
    "pretty_json": pretty_json,
    "quoted": quoted,
    "token_text": token_text,
    "token_title": token_title,
}
GLOBALS = {"segments": segments, "state_segments": state_segments, "page_url": page_url}
