"""A harness that makes two model calls and then hangs: past its budget it is killed and the session ends
``timed_out`` with both calls in one trajectory and a reward; cancelling its batch instead ends it
``cancelled`` the same way. Either way the harness process is gone."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support import process_alive, running_stack, wait_until

REPO = str(Path(__file__).resolve().parents[2])
TURNS = json.dumps({"turns": [{"content": "step one"}, {"content": "step two"}]})
PLUGINS = {"POLAR_PLUGIN_MODULES": "tests.e2e"}  # the hanging agent is named by import path


def hanging_task(task_id: str, pid_dir: Path, timeout: float, samples: int = 1) -> dict:
    return {
        "task_id": task_id,
        "instruction": "Work in two steps.",
        "num_samples": samples,
        "timeout_seconds": timeout,
        "reconstruction": "prefix_merging",
        "harness": {
            "name": "python",
            "command": "tests.e2e.agents.two_calls:run",
            "env": {"PYTHONPATH": REPO, "SLOW_AGENT_PID_DIR": str(pid_dir)},
        },
    }


def test_timeout_keeps_the_partial_trace(database_url: str, broker_url: str, tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    pids.mkdir()
    with running_stack(
        database_url, broker_url, tmp_path, policy="scripted", policy_config=TURNS, env=PLUGINS
    ) as stack:
        # Room for the harness to start and make both calls on a machine busy with another test process (8 s
        # was not: twice it got one call in), then it hangs until the budget kills it.
        submitted = stack.client.submit({"tasks": [hanging_task("hang", pids, timeout=20)]})
        stack.wait(submitted["batch_id"], timeout_s=300)
        (session,) = stack.client.sessions(submitted["batch_id"])
        assert session["state"] == "timed_out" and session["reward"] == 0.0 and session["num_calls"] == 2
        assert session["evaluation"]["outcome"] == "timeout"
        calls = stack.client.calls(session["session_id"])
        (trajectory,) = stack.client.trajectories(session["session_id"])
        assert trajectory["call_ids"] == [c["call_id"] for c in calls] and trajectory["reward"] == 0.0
        assert sum(trajectory["loss_mask"]) == sum(len(c["completion_token_ids"]) for c in calls)
        assert not process_alive(int((pids / session["session_id"]).read_text()))


def test_cancel_stops_a_running_session(database_url: str, broker_url: str, tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    pids.mkdir()
    with running_stack(
        database_url, broker_url, tmp_path, policy="scripted", policy_config=TURNS, run_concurrency=1, env=PLUGINS
    ) as stack:
        submitted = stack.client.submit({"tasks": [hanging_task("hang", pids, timeout=300, samples=3)]})
        batch_id = submitted["batch_id"]
        wait_until(
            lambda: any(s["state"] == "running" and s["num_calls"] == 2 for s in stack.client.sessions(batch_id)),
            timeout_s=120,
            message="a session to be running with its two calls",
        )
        result = stack.client.cancel(batch_id)
        assert result["cancelled"] + result["stopping"] == 3
        final = stack.wait(batch_id, timeout_s=300)
        assert final["counts"] == {"cancelled": 3}
        ran = [s for s in stack.client.sessions(batch_id) if s["num_calls"] == 2]
        assert len(ran) == 1
        assert len(stack.client.trajectories(ran[0]["session_id"])) == 1  # the partial trace is kept
        assert not process_alive(int((pids / ran[0]["session_id"]).read_text()))
