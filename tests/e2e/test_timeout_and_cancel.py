"""A harness that makes two model calls and then hangs: past its budget it is killed and the session ends
``timed_out`` with both calls in one trajectory and a reward; cancelling its batch instead ends it
``cancelled`` the same way, and its queued samples with it. Either way the harness process is gone. Both run on
the test process's shared stack, whose engine answers each call (the answers' text does not matter here)."""

from __future__ import annotations

from pathlib import Path

from tests.processes import process_alive, wait_until
from tests.shared_stack import RUN_CONCURRENCY
from tests.stacks import RunningStack

REPO = str(Path(__file__).resolve().parents[2])  # the hanging agent is named by import path (tests.e2e)


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


def test_timeout_keeps_the_partial_trace(shared_stack: RunningStack, tmp_path: Path) -> None:
    stack = shared_stack
    pids = tmp_path / "pids"
    pids.mkdir()
    # Room for the harness to start and make both calls on a machine busy with another test process (8 s was not:
    # twice it got one call in), then it hangs until the budget kills it.
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


def test_cancel_stops_running_and_queued_sessions(shared_stack: RunningStack, tmp_path: Path) -> None:
    stack = shared_stack
    pids = tmp_path / "pids"
    pids.mkdir()
    samples = RUN_CONCURRENCY + 2  # more than the stack's run slots: some are still queued when the cancel comes
    submitted = stack.client.submit({"tasks": [hanging_task("hang", pids, timeout=300, samples=samples)]})
    batch_id = submitted["batch_id"]
    wait_until(
        lambda: any(s["state"] == "running" and s["num_calls"] == 2 for s in stack.client.sessions(batch_id)),
        timeout_s=120,
        message="a session to be running with its two calls",
    )
    result = stack.client.cancel(batch_id)
    assert result["cancelled"] + result["stopping"] == samples
    final = stack.wait(batch_id, timeout_s=300)
    assert final["counts"] == {"cancelled": samples}
    sessions = list(stack.client.sessions(batch_id))
    assert any(s["num_calls"] == 2 for s in sessions)
    for session in sessions:
        if session["num_calls"]:  # the partial trace is kept
            assert len(stack.client.trajectories(session["session_id"])) == 1, session
    started = {path.name for path in pids.iterdir()}  # each harness that started wrote its pid
    assert len(started) <= RUN_CONCURRENCY
    assert all(not process_alive(int((pids / sid).read_text())) for sid in started)
    assert sum(s["session_id"] not in started for s in sessions) >= samples - RUN_CONCURRENCY  # never ran
