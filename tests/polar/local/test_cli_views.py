"""What ``polar status``, ``polar logs`` and ``polar open`` print, from the API's JSON (``polar.local.cli_views``); the
commands against a live stack are ``tests/e2e/test_cli.py``."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from polar.local.cli_views import console_url, logs_text, status_table, watch

NOW = datetime(2026, 11, 23, 12, 1, 23, tzinfo=UTC)


def batch(status: str = "running", **counts: int) -> dict[str, Any]:
    return {
        "batch_id": "b1", "name": "demo", "status": status, "num_sessions": 10, "counts": counts,
        "attempts": {"retried": 0, "out_of_attempts": 0}, "created_at": "2026-11-23T12:00:00+00:00",
        "finished_at": None,
    }  # fmt: skip


def test_the_status_table_lists_every_state_by_stage_in_lifecycle_order() -> None:
    table = status_table({**batch(pending=2, running=3, completed=4, failed=1), "attempts": {"retried": 1}}, NOW)
    lines = table.splitlines()
    assert lines[0] == "batch b1  demo: running"
    assert lines[1] == f"[{'#' * 15}{'.' * 15}] 5/10 finished (50%), elapsed 0:01:23"
    rows = [line.split() for line in lines[4:13]]
    assert rows == [
        ["queued", "pending", "2"], ["init", "init", "0"], ["ready", "ready", "0"], ["run", "running", "3"],
        ["postrun", "postrun", "0"], ["done", "completed", "4"], ["failed", "1"], ["timed_out", "0"],
        ["cancelled", "0"],
    ]  # fmt: skip
    assert lines[13] == "attempts lost to the infrastructure: 1 retried, 0 samples out of attempts"


def test_a_finished_batch_shows_its_own_duration_and_a_state_it_does_not_know() -> None:
    done = {**batch("finished", completed=9, paused=1), "finished_at": "2026-11-23T12:00:05+00:00"}
    table = status_table(done, NOW)
    assert "9/10 finished (90%), elapsed 0:00:05" in table  # not the time since, which keeps growing
    assert table.splitlines()[-1].split() == ["?", "paused", "1"]  # a newer API's state is still shown
    assert "attempts lost" not in table


def test_watch_shows_changes_and_stops_when_the_batch_has_finished() -> None:
    answers = iter([batch(pending=10), batch(pending=10), batch(running=10), batch("finished", completed=10)])
    shown: list[str] = []
    sleeps: list[float] = []
    last = watch(lambda: next(answers), lambda s: s["status"], shown.append, 0.5, False, sleeps.append)
    assert last["status"] == "finished"
    assert shown == ["running", "running", "finished"]  # the repeated first frame was not printed again
    assert sleeps == [0.5, 0.5, 0.5]
    answers = iter([batch(pending=10), batch(pending=10), batch("finished", completed=10)])
    redrawn: list[str] = []
    watch(lambda: next(answers), lambda s: s["status"], redrawn.append, 0.5, True, lambda _s: None)
    assert redrawn == ["running", "running", "finished"]  # on a terminal every frame redraws (the clock moves)


def test_logs_show_attempts_events_and_the_output_tail() -> None:
    session = {
        "session_id": "s1", "batch_id": "b1", "task_id": "t", "sample_index": 0, "attempt": 2, "max_attempts": 3,
        "state": "failed", "outcome": "harness_failed", "reward": 0.0, "exit_code": 1, "num_calls": 2, "node": "n1",
        "retry_of": "s0", "retried_as": None, "error": "harness exited with code 1: boom\n", "evaluation": {"a": 1},
    }  # fmt: skip
    events = {
        "items": [
            {"at": "2026-11-23T12:00:00.1234+00:00", "to_state": "pending", "node": "n1", "detail": "submitted",
             "duration_s": 0.5},
            {"at": "2026-11-23T12:00:00.6234+00:00", "to_state": "failed", "node": "n1", "detail": None,
             "duration_s": None},
        ],
        "seconds_in": {"pending": 0.5, "failed": 0.0},
        "total_s": 75.0,
    }  # fmt: skip
    text = logs_text(session, events)
    lines = text.splitlines()
    assert lines[:4] == [
        "session s1",
        "  batch b1  task t  sample 0  attempt 2 of 3",
        "  failed (harness_failed)  reward 0  exit code 1  calls 2  node n1",
        "  retry of s0",
    ]
    assert "2026-11-23 12:00:00.123  pending       0.500s  n1           submitted" in lines
    assert "2026-11-23 12:00:00.623  failed             -  n1" in lines
    assert "time in each state: pending 0.500s, failed 0.000s; total 0:01:15" in lines
    assert text.endswith("error / output tail:\nharness exited with code 1: boom")


def test_the_console_url_is_the_batch_page_under_the_api() -> None:
    assert console_url("http://api:8200/", "b1") == "http://api:8200/ui/batches/b1"
