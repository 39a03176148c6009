"""A session's events as a timeline: time until the next change, and the total per state."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

from polar.inspection.timeline import timeline

START = datetime(2026, 1, 1, tzinfo=UTC)


def event(seconds: float, before: str | None, after: str) -> SimpleNamespace:
    return SimpleNamespace(at=START + timedelta(seconds=seconds), from_state=before, to_state=after, node="n",
                           worker=None, detail=None)  # fmt: skip


def test_durations_per_event_and_per_state() -> None:
    line = timeline([event(0, None, "pending"), event(2, "pending", "init"), event(3, "init", "ready"),
                     event(3.5, "ready", "running"), event(10, "running", "postrun"),
                     event(11, "postrun", "completed")])  # fmt: skip
    assert [e.duration_s for e in line.events] == [2.0, 1.0, 0.5, 6.5, 1.0, None]
    assert line.seconds_in == {"pending": 2.0, "init": 1.0, "ready": 0.5, "running": 6.5, "postrun": 1.0,
                               "completed": 0.0}  # fmt: skip
    assert line.total_s == 11.0


def test_a_state_entered_twice_adds_up_and_naive_times_are_utc() -> None:
    naive = SimpleNamespace(at=datetime(2026, 1, 1, 0, 0, 4), from_state="init", to_state="ready", node="n",
                            worker=None, detail=None)  # fmt: skip
    line = timeline([event(0, None, "ready"), event(1, "ready", "init"), naive])
    assert line.seconds_in == {"ready": 1.0, "init": 3.0}
    assert timeline([]).total_s is None and timeline([event(0, None, "pending")]).total_s is None
