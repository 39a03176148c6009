"""The READY bound (DESIGN.md §2), read back from ``session_events``: with ``ready_buffer=2`` and a slow
init, never more than two sessions sit in init + ready, and the run worker never idles while one is ready."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from tests.support import command_task, running_stack


def test_ready_buffer_bounds_init_and_ready(database_url: str, broker_url: str, tmp_path: Path) -> None:
    env = {"POLAR_READY_BUFFER": "2"}
    with running_stack(database_url, broker_url, tmp_path, run_concurrency=1, env=env) as stack:
        task = command_task("slow-init", "sleep 0.4", samples=8, runtime={"prepare": [{"run": "sleep 1.5"}]})
        submitted = stack.client.submit({"tasks": [task]})
        final = stack.wait(submitted["batch_id"])
        assert final["counts"] == {"completed": 8}
        events = stack.sql("SELECT session_id, to_state, at FROM session_events ORDER BY at, id")

    state: dict[object, str] = {}
    buffered_max, idle_gaps = 0, []
    idle_since: datetime | None = None
    for session_id, to_state, at in events:
        state[session_id] = to_state
        states = list(state.values())
        buffered_max = max(buffered_max, states.count("init") + states.count("ready"))
        idle_with_work = states.count("running") == 0 and states.count("ready") > 0
        if idle_with_work and idle_since is None:
            idle_since = at
        elif not idle_with_work and idle_since is not None:
            idle_gaps.append((at - idle_since).total_seconds())
            idle_since = None
    assert buffered_max == 2, events
    # Hand-over from one run to the next ready session is only broker latency, never a wait for init (1.5 s).
    # The bound leaves room for a loaded machine (two test processes on two cores), not for an init.
    assert max(idle_gaps, default=0.0) < 1.0, idle_gaps
