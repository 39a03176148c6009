"""The file task every harness preset is proven on ("create hello.txt containing …"), shared by the modules that
run presets end to end: one batch of every harness x runtime on the test process's shared stack, whose engine
answers the task with its ``tool_user`` policy (tests/shared_stack.py), and the check that a session completed it
with reward 1.0 and that each captured call is what the engine served."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from polar.harnesses.install import install
from tests.shared_stack import RUN_CONCURRENCY
from tests.stacks import RunningStack

# A session's budget only catches a hung harness, so it is generous: on a loaded 2-core CI machine OpenClaw in bwrap
# spent 33 s preparing its first turn and 46 s on SQLite maintenance, and was cut at the 240 s it had then.
SESSION_BUDGET_S = 600


def batch_timeout_s(sessions: int, run_concurrency: int, budget_s: float = SESSION_BUDGET_S) -> float:
    """How long a batch of ``sessions`` may take at ``run_concurrency`` when every session uses its whole budget
    (waves of run slots, each with a minute for init, ready and postrun), plus two minutes to drain."""
    waves = -(-sessions // run_concurrency)
    return waves * (budget_s + 60) + 120


# A batch of CLI sessions takes a minute or more: its status read every two seconds, not five times a second (each
# read is a request to the API and a query).
POLL_S = 2.0


def wait_finished(stack: RunningStack, batch_id: str, timeout_s: float) -> dict[str, Any]:
    """``RunningStack.wait`` at :data:`POLL_S`."""
    return stack.wait(batch_id, timeout_s=timeout_s, poll_s=POLL_S)


def content_for(harness: str, runtime: str) -> str:
    return f"HELLO-{harness.replace('_', '-')}-{runtime}-7"


def file_task_results(
    stack: RunningStack, name: str, harnesses: Sequence[str], runtimes: Sequence[str]
) -> dict[str, Any]:
    """Install ``harnesses``, run the file task for each harness x runtime in one batch on ``stack`` (the shared
    stack); the sessions by ``"<harness>-<runtime>"``, with ``"stack"`` and
    ``"engine"`` (the engine's log since the module began, by response id)."""
    install(harnesses)
    tasks = [
        {
            "task_id": f"{harness}-{runtime}",
            "instruction": f"Create hello.txt containing {content_for(harness, runtime)}",
            "timeout_seconds": SESSION_BUDGET_S,
            "runtime": {"backend": runtime},
            "harness": {"name": harness},
            "evaluator": {
                "name": "tests.e2e.file_check:FileContent",
                "config": {"path": "hello.txt", "content": content_for(harness, runtime)},
            },
        }
        for harness in harnesses
        for runtime in runtimes
    ]
    submitted = stack.client.submit({"name": name, "tasks": tasks})
    wait_finished(stack, submitted["batch_id"], batch_timeout_s(len(tasks), RUN_CONCURRENCY))
    found: dict[str, Any] = {"stack": stack, "engine": stack.engine_entries()}
    for session in stack.client.sessions(submitted["batch_id"]):
        found[session["task_id"]] = session
    return found


def check_file_task(results: dict[str, Any], harness: str, runtime: str, min_calls: int = 2) -> None:
    """The session completed the file task (reward 1.0) in at least ``min_calls`` calls, each token-exact."""
    session = results[f"{harness}-{runtime}"]
    details = session.get("evaluation") or {}
    diagnosis = f"{harness}/{runtime}: error={session['error']!r}\nlog:\n{details.get('harness_log', '')}"
    assert (session["state"], session["exit_code"]) == ("completed", 0), diagnosis
    assert details.get("found", "").rstrip("\n") == content_for(harness, runtime), diagnosis
    assert session["reward"] == 1.0

    stack: RunningStack = results["stack"]
    calls = stack.client.calls(session["session_id"])
    assert len(calls) >= min_calls, diagnosis
    for call in calls:
        served = results["engine"][call["response"]["id"]]
        assert call["status_code"] == 200
        assert call["prompt_token_ids"] == served["prompt_token_ids"]
        assert call["completion_token_ids"] == served["token_ids"]
        assert len(call["logprobs"]) == len(call["completion_token_ids"])
    assert stack.client.trajectories(session["session_id"])
