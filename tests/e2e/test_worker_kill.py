"""SIGKILL a run worker mid-session: the session still ends in a terminal state with the call it already
made rebuilt into a trajectory (kept for audit), the orphaned harness is killed, the sample is retried as a new
attempt that completes, the lost attempt never reaches the feed or the exports, and nothing is duplicated, even
after the broker redelivers the killed worker's unacknowledged message.

Kombu's Redis transport puts back a message left unacknowledged past the visibility timeout when a worker starts,
and then only about every 100 s (``unacked_restore_interval`` x ``unacked_restore_throttle``). So the replacement
run worker starts only once the visibility timeout has passed since the killed worker took the victim's message:
its start-up sweep must hand that same message (the same Celery task id) back, and the test waits until the
replacement has handled it before it counts what the batch left."""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path

from tests.processes import process_alive, wait_until
from tests.stacks import running_stack

REPO = str(Path(__file__).resolve().parents[2])
VISIBILITY_S = 6.0  # well past what a loaded machine's prep worker holds its short stages' messages


def run_tasks(log: str, event: str) -> list[str]:
    """The Celery task ids of the ``polar.run`` messages a worker's log says were ``received`` (or ``succeeded``)."""
    return re.findall(rf"Task polar\.run\[([0-9a-f-]+)\] {event}", log)


def slow_task(task_id: str, seconds: float, pid_dir: Path) -> dict:
    return {
        "task_id": task_id,
        "instruction": "work slowly",
        "harness": {
            "name": "python",
            "command": "tests.e2e.agents.slow:run",
            "env": {"PYTHONPATH": REPO, "SLOW_AGENT_SECONDS": str(seconds), "SLOW_AGENT_PID_DIR": str(pid_dir)},
        },
    }


def test_killed_run_worker_loses_nothing(database_url: str, broker_url: str, tmp_path: Path) -> None:
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    env = {"POLAR_VISIBILITY_TIMEOUT": f"{VISIBILITY_S:g}", "POLAR_PLUGIN_MODULES": "tests.e2e"}
    with running_stack(database_url, broker_url, tmp_path, run_concurrency=1, env=env) as stack:
        batch = {"tasks": [slow_task("victim", 120, pid_dir), slow_task("next", 0.5, pid_dir)]}
        submitted = stack.client.submit(batch)
        victim = wait_until(
            lambda: stack.sql("SELECT id FROM sessions WHERE task_id = 'victim' AND state = 'running'"),
            message="the victim session to start running",
        )[0][0]
        delivered_by = time.monotonic()  # the victim's run message was delivered before it ran
        wait_until(
            lambda: stack.sql("SELECT 1 FROM sessions WHERE id = :id AND num_calls = 1", id=victim),
            message="the victim session to make its call",
        )
        harness_pid = int(wait_until(lambda: (pid_dir / str(victim)).exists() and (pid_dir / str(victim)).read_text()))
        stack.stack.signal("worker-run", signal.SIGKILL)
        stack.stack.processes["worker-run"].wait()
        worker_log = stack.stack.log("worker-run")
        killed_log = worker_log.read_bytes()
        received, finished = (run_tasks(killed_log.decode(errors="replace"), e) for e in ("received", "succeeded"))
        # One run slot, one message prefetched: the victim's is the one the killed worker held unacknowledged.
        (victim_message,) = [task for task in received if task not in finished]
        # The replacement's start-up sweep comes after this: the victim's message is past its visibility timeout.
        time.sleep(max(0.0, delivered_by + VISIBILITY_S - time.monotonic()))
        stack.stack.start_one("worker-run")

        batch_id = submitted["batch_id"]
        final = stack.wait(batch_id, timeout_s=300)
        assert final["counts"] == {"completed": 2}  # each sample once, by its latest attempt
        assert final["attempts"] == {"retried": 1, "out_of_attempts": 0}
        # The broker handed the killed worker's message back, and the replacement has handled it (changing nothing,
        # as the counts below say).
        stack.wait_until(
            lambda: victim_message in run_tasks(worker_log.read_bytes()[len(killed_log) :].decode(errors="replace"),
                                                "succeeded"),
            message=f"the killed worker's message {victim_message} to come back and be handled",
        )  # fmt: skip

        (row,) = stack.sql(
            "SELECT state, outcome, outcome_class, error, num_calls, reward, retried_as FROM sessions WHERE id = :id",
            id=victim,
        )
        assert (row.state, row.outcome, row.outcome_class) == ("failed", "worker_lost", "infrastructure")
        assert "run worker lost" in row.error and row.reward is None
        assert not process_alive(harness_pid)
        (retry,) = stack.sql("SELECT attempt, state, outcome_class, retry_of FROM sessions WHERE id = :id",
                             id=row.retried_as)  # fmt: skip
        assert (retry.attempt, retry.state, retry.outcome_class, retry.retry_of) == (
            2,
            "completed",
            "task",
            victim,
        )
        per_session = stack.sql(
            "SELECT s.task_id, s.attempt, s.num_calls, count(t.id) FROM sessions s LEFT JOIN trajectories t "
            "ON t.session_id = s.id GROUP BY s.id ORDER BY s.task_id, s.attempt"
        )
        assert [tuple(r) for r in per_session] == [("next", 1, 1, 1), ("victim", 1, 1, 1), ("victim", 2, 1, 1)]
        terminal_events = stack.sql(
            "SELECT session_id, count(*) FROM session_events WHERE to_state IN ('completed', 'failed') "
            "GROUP BY session_id"
        )
        assert sorted(r[1] for r in terminal_events) == [1, 1, 1]

        # The lost attempt is audit only: neither the feed nor the exports carry it.
        feed = stack.client.feed(batch_id, after=0, wait_s=0)
        assert str(victim) not in {item["session_id"] for item in feed["items"]}
        assert {item["attempt"] for item in feed["items"] if item["task_id"] == "victim"} == {2}
        stack.client.download(batch_id, "rl", "jsonl", None, tmp_path / "rl.jsonl")
        rows = [json.loads(line) for line in (tmp_path / "rl.jsonl").read_text().splitlines()]
        assert sorted((r["task_id"], r["session_id"] == str(victim)) for r in rows) == [
            ("next", False),
            ("victim", False),
        ]
