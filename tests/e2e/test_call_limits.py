"""Per-session call limits end to end: a batch over the API, Celery stage workers, and real harnesses calling the
gunicorn-served proxy (its counts in Redis) on Postgres. The runaway harness is refused at its ``max_calls`` with
OpenAI's 429 while its batch's other sessions run to the end; a bad limit is a 400 naming the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from polar.client import APIError
from tests.shared_stack import routed
from tests.stacks import RunningStack

REPO = str(Path(__file__).resolve().parents[2])


def looping_task(task_id: str, calls: int, expect_answers: int, samples: int = 1, **limits: Any) -> dict[str, Any]:
    env = {"PYTHONPATH": REPO, "LOOP_CALLS": str(calls), "LOOP_EXPECT_ANSWERS": str(expect_answers)}
    return {
        "task_id": task_id,
        "instruction": routed("limits", "Say something."),
        "num_samples": samples,
        "timeout_seconds": 120,
        "harness": {"name": "python", "command": "tests.e2e.agents.looping:run", "env": env},
        **limits,
    }


def test_a_looping_harness_hits_its_limit_and_nothing_else_suffers(shared_stack: RunningStack) -> None:
    stack = shared_stack  # the looping agent is named by import path; its "model" says "OK." to everything
    with pytest.raises(APIError) as bad:
        stack.client.submit({"tasks": [looping_task("bad", 1, 1, max_calls=0)]})
    assert bad.value.status == 400 and "tasks[0].max_calls" in str(bad.value)

    batch = {"tasks": [looping_task("runaway", 50, 3, max_calls=3), looping_task("steady", 8, 8, samples=2)]}
    submitted = stack.client.submit(batch)
    final = stack.wait(submitted["batch_id"])
    sessions = list(stack.client.sessions(submitted["batch_id"]))
    assert final["counts"] == {"completed": 3}, [(s["task_id"], s["error"]) for s in sessions]
    calls = {s["session_id"]: stack.client.calls(s["session_id"]) for s in sessions}
    for session in sessions:
        assert session["exit_code"] == 0, session["error"]
        expected = 3 if session["task_id"] == "runaway" else 8
        # The refused call was not sent on, nor recorded: the session holds just its answered calls.
        assert [c["status_code"] for c in calls[session["session_id"]]] == [200] * expected
