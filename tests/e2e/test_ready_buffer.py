"""The READY bound (DESIGN.md §2), read back from ``session_events``: with ``ready_buffer=2`` and a slow
init, never more than two sessions sit in init + ready, and the run worker never idles while one is ready."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from tests.stacks import running_stack
from tests.stage_calls import command_task


def test_ready_buffer_bounds_init_and_ready(database_url: str, broker_url: str, tmp_path: Path) -> None:
    env = {"POLAR_READY_BUFFER": "2"}
    with running_stack(database_url, broker_url, tmp_path, run_concurrency=1, env=env) as stack:
        # An init of 3 s: twice the longest hand-over seen on the slowest CI runner (1.58 s), which the last
        # assertion compares with it.
        task = command_task("slow-init", "sleep 0.4", samples=8, runtime={"prepare": [{"run": "sleep 3"}]})
        submitted = stack.client.submit({"tasks": [task]})
        final = stack.wait(submitted["batch_id"])
        assert final["counts"] == {"completed": 8}
        events = stack.sql("SELECT session_id, to_state, at FROM session_events ORDER BY at, id")

    state: dict[object, str] = {}
    buffered_max, gaps = 0, []
    idle_since: datetime | None = None  # the run slot idle while a session is ready
    init_at: dict[object, datetime] = {}
    inits = []  # each session's init, from its start to its ready
    for session_id, to_state, at in events:
        state[session_id] = to_state
        if to_state == "init":
            init_at[session_id] = at
        elif to_state == "ready":
            inits.append((at - init_at[session_id]).total_seconds())
        states = list(state.values())
        buffered_max = max(buffered_max, states.count("init") + states.count("ready"))
        idle_with_work = states.count("running") == 0 and states.count("ready") > 0
        if idle_with_work and idle_since is None:
            idle_since = at
        elif not idle_with_work and idle_since is not None:
            gaps.append(((at - idle_since).total_seconds(), to_state))
            idle_since = None
    assert buffered_max == 2, events
    # Hand-over from one run to the next ready session never waits for an init: each time the slot is idle with a
    # session ready, a run starts sooner than any init here took (compared within the run, so a loaded machine
    # slows both sides alike). Which ready session starts is the queue's order: with two ready at once, CI saw the
    # later one taken first.
    assert gaps and all(to_state == "running" for _, to_state in gaps), gaps
    assert max(seconds for seconds, _ in gaps) < min(inits), (gaps, inits)
