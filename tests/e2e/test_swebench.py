"""The ``swebench`` evaluator end to end in the Docker runtime: a tiny SWE-bench-format instance (a Python repository
whose ``mul`` adds), the real Codex CLI driven through the proxy by the reference engine's ``tool_user`` policy,
three sessions in one batch on the test process's shared stack (its ``tool_user`` route answers the "create"
instructions). The one whose model writes the right fix is resolved (1.0); a wrong fix and no change
score 0.0. Each report is read back from the ``swebench_reports`` view, and no container of either role is left."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from polar.harnesses.install import install
from tests.docker_engine import containers_of, require_docker_image
from tests.processes import wait_until
from tests.stacks import RunningStack
from tests.swebench_repo import FIXED, TEST_CMD, WRONG, SweRepo, build_swe_repo

pytestmark = pytest.mark.long(seconds=29)  # dealt out first, longest first (tests/conftest.py)

# What each session's model is told (tool_user creates "FILE containing CONTENT" with the harness's own tool).
INSTRUCTIONS = {
    "right-fix": f'Create calc.py containing "{FIXED}"',
    "wrong-fix": f'Create calc.py containing "{WRONG}"',
    "no-change": "Read calc.py and explain what mul does; change nothing.",
}
REPORT = """SELECT task_id, state, reward, instance_id, resolved, resolution_status, patch_is_empty, patch_applied,
                  fail_to_pass_passed, fail_to_pass_failed, pass_to_pass_passed, pass_to_pass_failed
           FROM swebench_reports WHERE batch_id = :batch ORDER BY task_id"""


def _task(swe: SweRepo, task_id: str) -> dict[str, Any]:
    return {
        "task_id": task_id,
        "instruction": INSTRUCTIONS[task_id],
        "timeout_seconds": 240,
        "runtime": {"backend": "docker", "prepare": swe.prepare_steps()},
        "harness": {"name": "codex"},
        "evaluator": {
            "name": "swebench",
            "config": {"instance": swe.instance, "repo_dir": ".", "test_cmd": TEST_CMD, "timeout_seconds": 120},
        },
    }


def test_swebench_rewards_the_right_fix_only(shared_stack: RunningStack, tmp_path: Path) -> None:
    require_docker_image()
    install(["codex"])
    stack = shared_stack
    swe = build_swe_repo(tmp_path / "origin")
    submitted = stack.client.submit({"tasks": [_task(swe, task_id) for task_id in INSTRUCTIONS]})
    stack.wait(submitted["batch_id"])
    sessions = {s["task_id"]: s for s in stack.client.sessions(submitted["batch_id"])}
    diagnosis = {k: (s["state"], s["error"], (s.get("evaluation") or {}).get("log_tail")) for k, s in sessions.items()}
    assert {k: (s["state"], s["reward"]) for k, s in sessions.items()} == {
        "right-fix": ("completed", 1.0),
        "wrong-fix": ("completed", 0.0),
        "no-change": ("completed", 0.0),
    }, diagnosis
    for session in sessions.values():  # every change came from the model, through the proxy
        assert stack.client.calls(session["session_id"]), session["task_id"]

    rows = {row.task_id: row for row in stack.sql(REPORT, batch=submitted["batch_id"])}
    assert {k: tuple(row)[1:] for k, row in rows.items()} == {
        "no-change": ("completed", 0.0, "polar__calc-1", False, "RESOLVED_NO", True, False, 0, 2, 1, 0),
        "right-fix": ("completed", 1.0, "polar__calc-1", True, "RESOLVED_FULL", False, True, 2, 0, 1, 0),
        "wrong-fix": ("completed", 0.0, "polar__calc-1", False, "RESOLVED_NO", False, True, 0, 2, 1, 0),
    }
    # The whole report is the session's evaluation: the diff taken, and the per-test statuses.
    ((patch, results),) = stack.sql(
        "SELECT s.evaluation ->> 'model_patch', s.evaluation -> 'test_results' FROM sessions s "
        "JOIN swebench_reports r ON r.session_id = s.id WHERE r.task_id = 'right-fix' AND r.batch_id = :batch",
        batch=submitted["batch_id"],
    )
    assert "-    return a + b\n+    return a * b" in patch
    assert set(results.values()) == {"PASSED"} and len(results) == 3

    ids = [session["session_id"] for session in sessions.values()]
    wait_until(lambda: not any(containers_of(i) for i in ids), timeout_s=120, message="both runtimes removed")
