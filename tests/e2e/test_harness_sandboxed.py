"""The six real CLIs in the sandboxed runtimes: each inside bubblewrap and inside a Docker container, where the
network holds nothing but the relay to the proxy, through the whole pipeline (API, stage workers, proxy,
reference engine answering with the ``tool_user`` policy: the test process's shared stack). All twelve sessions run
in one batch; the file each CLI was asked to create is checked in the session's work folder by the ``FileContent``
evaluator, and every container is gone once its session has ended."""

from __future__ import annotations

from typing import Any

import pytest

from polar.harnesses.install import install
from tests.docker_engine import containers_of, require_docker_image
from tests.e2e.file_task import SESSION_BUDGET_S, batch_timeout_s, wait_finished
from tests.shared_stack import RUN_CONCURRENCY
from tests.stacks import RunningStack

# Dealt out first, longest first (tests/conftest.py). It installs the six CLIs first and then waits for three waves
# of sessions that may each use their whole budget: the default 300 s per test cut it short on slow machines.
pytestmark = [pytest.mark.long(seconds=45), pytest.mark.timeout(2700)]

CLIS = ("claude_code", "codex", "gemini_cli", "qwen_code", "opencode", "pi")
BACKENDS = ("bwrap", "docker")


def cli_task(cli: str, backend: str) -> dict[str, Any]:
    content = f"HELLO-{cli}-{backend}"
    return {
        "task_id": f"{cli}-{backend}",
        "instruction": f"Create hello.txt containing {content}",
        "timeout_seconds": SESSION_BUDGET_S,
        "runtime": {"backend": backend},
        "harness": {"name": cli},
        "evaluator": {"name": "tests.e2e.file_check:FileContent", "config": {"path": "hello.txt", "content": content}},
    }


def test_the_six_clis_in_bwrap_and_docker(shared_stack: RunningStack) -> None:
    require_docker_image()
    install(CLIS)
    stack = shared_stack
    tasks = [cli_task(cli, backend) for backend in BACKENDS for cli in CLIS]
    submitted = stack.client.submit({"name": "sandboxed-clis", "tasks": tasks})
    wait_finished(stack, submitted["batch_id"], batch_timeout_s(len(tasks), RUN_CONCURRENCY))
    sessions = list(stack.client.sessions(submitted["batch_id"]))
    failures = []
    for session in sessions:
        details = session.get("evaluation") or {}
        if session["reward"] != 1.0:
            failures.append(f"{session['task_id']}: {session['state']} error={session['error']!r} "
                            f"found={details.get('found')!r}")  # fmt: skip
            continue
        calls = stack.client.calls(session["session_id"])
        assert calls and all(c["completion_token_ids"] for c in calls), session["task_id"]
        assert stack.client.trajectories(session["session_id"]), session["task_id"]
    assert not failures, "\n".join(failures)
    assert len(sessions) == len(tasks)
    # postrun removes a session's containers right after storing its end
    stack.wait_until(lambda: all(containers_of(s["session_id"]) == [] for s in sessions), message="containers to go")
