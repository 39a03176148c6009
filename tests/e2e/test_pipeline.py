"""End to end on the real services: a batch over HTTP to the gunicorn-served API, the Celery stage workers, the
gunicorn-served proxy in front of the reference engine, Postgres and Redis (the test process's shared stack)."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.processes import HANG_GUARD_S
from tests.stacks import RunningStack

REPO = str(Path(__file__).resolve().parents[2])


def calculator_task(task_id: str, expression: str, samples: int) -> dict:
    return {
        "task_id": task_id,
        "instruction": f"What is {expression}?",
        "num_samples": samples,
        "timeout_seconds": 120,
        "harness": {"name": "python", "command": "polar.agents.calculator:run"},
    }


def test_batch_end_to_end_is_token_exact(shared_stack: RunningStack) -> None:
    stack = shared_stack  # the streaming agent is named by import path: tests.e2e is a plugin module there
    batch = {
        "name": "e2e",
        "tasks": [
            calculator_task("mul", "17 * 23", 2),
            calculator_task("sum", "(35 + 65) * 3", 2),
            {
                "task_id": "stream",
                "instruction": "Say something.",
                "num_samples": 1,
                "harness": {"name": "python", "command": "tests.e2e.agents.streaming:run",
                            "env": {"PYTHONPATH": REPO}},
            },
        ],
    }  # fmt: skip
    submitted = stack.client.submit(batch)
    assert submitted["num_sessions"] == 5
    final = stack.wait(submitted["batch_id"])
    errors = [s["error"] for s in stack.client.sessions(submitted["batch_id"]) if s["error"]]
    assert final["counts"] == {"completed": 5}, errors
    assert final["finished_at"] is not None

    engine_log = stack.engine_entries()
    sessions = list(stack.client.sessions(submitted["batch_id"]))
    total_calls = 0
    for session in sessions:
        assert session["reward"] == 1.0 and session["exit_code"] == 0
        calls = stack.client.calls(session["session_id"])
        assert [c["seq"] for c in calls] == list(range(1, len(calls) + 1))
        assert len(calls) == 2  # calculator: tool call + answer; streaming agent: two turns
        for call in calls:
            logged = engine_log[call["response"]["id"]]
            # What the engine sampled, exactly, and the prompt as the engine tokenised it.
            assert call["completion_token_ids"] == logged["token_ids"]
            assert call["prompt_token_ids"] == logged["prompt_token_ids"]
            normalized = call["normalized_request"]
            tokenize = {"model": normalized["model"], "messages": normalized["messages"]}
            if normalized.get("tools"):
                tokenize["tools"] = normalized["tools"]
            tokenized = httpx.post(f"{stack.engine_url}/tokenize", json=tokenize, timeout=HANG_GUARD_S)
            tokens = tokenized.json()["tokens"]
            assert call["prompt_token_ids"] == tokens
            assert len(call["logprobs"]) == len(call["completion_token_ids"])
            assert call["status_code"] == 200 and call["finish_reason"] in {"stop", "tool_calls"}
        trajectories = stack.client.trajectories(session["session_id"])
        assert len(trajectories) == len(calls)
        for trajectory, call in zip(trajectories, calls, strict=True):
            assert trajectory["call_ids"] == [call["call_id"]]
            assert trajectory["token_ids"] == call["prompt_token_ids"] + call["completion_token_ids"]
            assert trajectory["loss_mask"] == [0] * len(call["prompt_token_ids"]) + [1] * len(
                call["completion_token_ids"]
            )
            assert trajectory["reward"] == 1.0
        total_calls += len(calls)
    assert total_calls == len(engine_log) == 10

    streamed = next(s for s in sessions if s["task_id"] == "stream")
    stream_calls = stack.client.calls(streamed["session_id"])
    assert [c["stream"] for c in stream_calls] == [True, False]
    assert stream_calls[0]["model"] == "client-model-name"

    # Secrets stay out of captured data: no proxy key in any stored request or response.
    rows = stack.sql(
        "SELECT c.request::text || c.normalized_request::text || c.response::text FROM model_calls_full c "
        "JOIN sessions s ON s.id = c.session_id WHERE s.batch_id = :b",
        b=submitted["batch_id"],
    )
    assert len(rows) == total_calls and all("pk-" not in row[0] for row in rows)
    # Events: every session walked every state once, in order.
    paths = stack.sql(
        "SELECT string_agg(e.to_state, ',' ORDER BY e.id) FROM session_events e JOIN sessions s "
        "ON s.id = e.session_id WHERE s.batch_id = :b GROUP BY e.session_id",
        b=submitted["batch_id"],
    )
    assert len(paths) == 5
    assert {row[0] for row in paths} == {"pending,init,ready,running,postrun,completed"}
