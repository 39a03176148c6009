"""A session's history from ``session_events``: every state change, who made it (node, worker), and how long the
session then stayed in the state it entered.

    line = session_timeline(services, session_id)
    line.events[0].duration_s      # seconds from this change to the next one (None for the last)
    line.seconds_in["running"]     # total seconds spent running, over every entry into the state
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from polar.clock import as_utc, iso
from polar.errors import NotFound
from polar.services import Services
from polar.storage.models import Session, SessionEvent
from polar.storage.serialization import EventJSON, SessionEventsJSON


@dataclass(frozen=True)
class TimelineEvent:
    at: datetime
    from_state: str | None
    to_state: str
    node: str
    worker: str | None
    detail: str | None
    duration_s: float | None  # until the next event; None for the latest


@dataclass(frozen=True)
class Timeline:
    events: tuple[TimelineEvent, ...]
    seconds_in: dict[str, float]  # state -> seconds, in the order the session first entered each state

    @property
    def total_s(self) -> float | None:
        if len(self.events) < 2:
            return None
        return (self.events[-1].at - self.events[0].at).total_seconds()


def timeline(rows: Iterable[Any]) -> Timeline:
    """``rows`` (with ``at``, ``from_state``, ``to_state``, ``node``, ``worker``, ``detail``) in the order they
    happened, as a ``Timeline``."""
    ordered = list(rows)
    events: list[TimelineEvent] = []
    seconds_in: dict[str, float] = {}
    for index, row in enumerate(ordered):
        at = as_utc(row.at)
        assert at is not None  # the column is NOT NULL
        following = as_utc(ordered[index + 1].at) if index + 1 < len(ordered) else None
        duration = max((following - at).total_seconds(), 0.0) if following else None
        events.append(TimelineEvent(at, row.from_state, row.to_state, row.node, row.worker, row.detail, duration))
        seconds_in.setdefault(row.to_state, 0.0)
        if duration is not None:
            seconds_in[row.to_state] += duration
    return Timeline(tuple(events), seconds_in)


def session_timeline(services: Services, session_id: uuid.UUID) -> Timeline:
    with services.db.unit() as db:
        if db.get(Session, session_id) is None:
            raise NotFound(f"session {session_id} not found")
        rows = db.execute(
            sa.select(
                SessionEvent.at,
                SessionEvent.from_state,
                SessionEvent.to_state,
                SessionEvent.node,
                SessionEvent.worker,
                SessionEvent.detail,
            )
            .where(SessionEvent.session_id == session_id)
            .order_by(SessionEvent.id)
        ).all()
    return timeline(rows)


def events_json(session_id: object, line: Timeline) -> SessionEventsJSON:
    """A session's ``session_events`` as the API returns them, with the time spent in each state."""
    items: list[EventJSON] = [
        {
            "at": iso(event.at) or "",
            "from_state": event.from_state,
            "to_state": event.to_state,
            "node": event.node,
            "worker": event.worker,
            "detail": event.detail,
            "duration_s": None if event.duration_s is None else round(event.duration_s, 3),
        }
        for event in line.events
    ]
    seconds_in = {state: round(seconds, 3) for state, seconds in line.seconds_in.items()}
    total = line.total_s
    return {"session_id": str(session_id), "items": items, "seconds_in": seconds_in,
            "total_s": None if total is None else round(total, 3)}  # fmt: skip
