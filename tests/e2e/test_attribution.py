"""Audit G1 end to end (the pause on the test process's shared stack), on the Celery workers, the proxy and the
reference engine: a failed attempt is the infrastructure's loss only when the infrastructure plausibly caused it. A
weight-sync pause's 429 the harness recovered from (an answer came after it) leaves its later failure a task outcome,
scored on its first attempt; the same 429 as the last thing before it failed is ``engine_failed`` and the sample is
retried. A 504 on a healthy engine that was still generating the call (``generation_timeout``) is the policy's doing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.stacks import RunningStack, running_stack

REPO = str(Path(__file__).resolve().parents[2])
PLUGINS = {"POLAR_PLUGIN_MODULES": "tests.e2e"}
SESSIONS = (
    "SELECT task_id, attempt, state, outcome, outcome_class, reward, exit_code, retried_as IS NOT NULL, error "
    "FROM sessions ORDER BY task_id, attempt"
)
# On the shared stack: one batch's.
OF_BATCH = "SELECT 1 FROM sessions WHERE batch_id = :b"
SESSIONS_OF_BATCH = SESSIONS.replace("FROM sessions", "FROM sessions WHERE batch_id = :b")
ANSWERED = (
    "SELECT 1 FROM model_calls c JOIN sessions s ON s.id = c.session_id WHERE s.batch_id = :b AND c.status_code = 200"
)


def harness_task(task_id: str, command: str, instruction: str) -> dict[str, Any]:
    return {
        "task_id": task_id,
        "instruction": instruction,
        "harness": {"name": "python", "command": command, "env": {"PYTHONPATH": REPO}},
    }


def test_a_refusal_the_harness_recovered_from_is_not_the_infrastructures(
    shared_stack: RunningStack, tmp_path: Path
) -> None:
    stack, go = shared_stack, tmp_path / "go"

    def paused_call(task_id: str, then: str) -> dict[str, Any]:
        return harness_task(task_id, "tests.e2e.agents.paused_call:run", json.dumps({"go": str(go), "then": then}))

    batch = stack.client.submit({"tasks": [paused_call("gives-up", "exit"), paused_call("recovers", "recover")]})
    of_batch = {"b": batch["batch_id"]}
    stack.wait_until(
        lambda: len(stack.sql(ANSWERED, **of_batch)) == 2,
        message="both harnesses answered once",
    )
    stack.client.pause(mode="reject")
    go.touch()
    stack.wait_until(
        lambda: stack.sql(f"{OF_BATCH} AND task_id = 'gives-up' AND attempt = 1 AND state = 'failed'", **of_batch),
        message="the harness that gave up on its refusal to end",
    )
    stack.wait_until(
        lambda: stack.sql(
            "SELECT 1 FROM call_refusals r JOIN sessions s ON s.id = r.session_id "
            "WHERE s.batch_id = :b AND s.task_id = 'recovers' AND r.reason = 'paused'",
            **of_batch,
        ),
        message="the recovering harness to be refused",
    )
    stack.client.resume()
    stack.wait(batch["batch_id"])
    rows = [tuple(row) for row in stack.sql(SESSIONS_OF_BATCH, **of_batch)]
    gave_up, retried, recovered = rows
    assert gave_up[:8] == ("gives-up", 1, "failed", "engine_failed", "infrastructure", None, 1, True), rows
    assert "the proxy refused 1 of its calls (paused), the last of them at or after the harness's last answer" in (
        gave_up[8] or ""
    )
    assert retried[:8] == ("gives-up", 2, "completed", "exited", "task", 1.0, 0, False), rows
    # Refused, recovered, then failed by itself: the policy's failure, scored on its only attempt.
    assert recovered[:8] == ("recovers", 1, "failed", "exited", "task", 0.0, 1, False), rows


# ~300 tokens at 2 tokens/s: the call generates past the proxy's 2 s engine timeout (capped at 40 tokens, 20 s).
LONG_ANSWER = json.dumps({"turns": [{"content": " ".join(["word"] * 300)}]})


def test_a_call_still_generating_at_the_engine_timeout_is_the_policys(
    database_url: str, broker_url: str, tmp_path: Path
) -> None:
    env = {**PLUGINS, "POLAR_ENGINE_TIMEOUT": "2"}
    slow = ["--decode-rate", "2"]
    with running_stack(
        database_url, broker_url, tmp_path, policy="scripted", policy_config=LONG_ANSWER, env=env, engine_args=slow
    ) as stack:
        batch = stack.client.submit({"tasks": [harness_task("generates", "tests.e2e.agents.one_call:run", "Talk.")]})
        stack.wait(batch["batch_id"])
        rows = [tuple(row) for row in stack.sql(SESSIONS)]
        calls = [tuple(row) for row in stack.sql("SELECT status_code, failure_kind FROM model_calls")]
    # one_call exits 4 on an error status other than a tokenless 502: here the 504 it got.
    assert calls == [(504, "generation_timeout")], (calls, rows)
    ((*ended, _error),) = rows
    assert tuple(ended) == ("generates", 1, "failed", "exited", "task", 0.0, 4, False), rows
