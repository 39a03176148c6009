"""Audit F5 end to end: an engine whose 200 answers lack token ids or logprobs fails the call. The harness (the
real ``openai`` SDK, in a session run by the Celery workers) gets a 502 in OpenAI's error shape, the call is
recorded as failed by the engine with no tokens, and the attempt ends ``engine_failed`` (infrastructure), never a
scored session built on padded tokens. A whole answer from the same engine still goes through."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.e2e.tokenless_engine import tokenless_engine
from tests.stacks import running_stack

REPO = str(Path(__file__).resolve().parents[2])


def one_call_task(task_id: str, instruction: str) -> dict[str, Any]:
    return {
        "task_id": task_id,
        "instruction": instruction,
        "timeout_seconds": 120,
        "max_attempts": 1,
        "harness": {"name": "python", "command": "tests.e2e.agents.one_call:run", "env": {"PYTHONPATH": REPO}},
    }


def test_an_answer_without_ids_or_logprobs_is_an_engine_failure(
    database_url: str, broker_url: str, tmp_path: Path
) -> None:
    plugins = {"POLAR_PLUGIN_MODULES": "tests.e2e"}
    gaps = ("no-ids", "no-logprobs", "short-logprobs")
    with (
        tokenless_engine() as engine,
        running_stack(database_url, broker_url, tmp_path, env=plugins, engine_url=engine) as stack,
    ):
        tasks = [one_call_task(gap, f"Answer ({gap}).") for gap in gaps]
        submitted = stack.client.submit({"tasks": [*tasks, one_call_task("whole", "Answer.")]})
        stack.wait(submitted["batch_id"])
        sessions = {s["task_id"]: s for s in stack.client.sessions(submitted["batch_id"])}
        whole = sessions.pop("whole")
        assert (whole["exit_code"], whole["outcome"]) == (0, "exited"), stack.diagnosis(submitted["batch_id"])
        for gap, session in sessions.items():
            # exit code 3: the SDK raised APIStatusError with status 502 and OpenAI's error body.
            assert session["exit_code"] == 3, (gap, stack.diagnosis(submitted["batch_id"]))
            assert (session["outcome"], session["outcome_class"], session["reward"]) == (
                "engine_failed", "infrastructure", None,
            ), gap  # fmt: skip
            (call,) = stack.client.calls(session["session_id"])
            assert call["status_code"] == 502 and call["completion_token_ids"] == [], (gap, call)
            assert call["logprobs"] == [] and "token-exact capture" in str(call["response"]), (gap, call)
