"""Sessions with ``runtime.backend = "docker"`` through the whole pipeline: init creates the container, run
executes the harness inside it, postrun removes it, even when the run worker is SIGKILLed mid-run."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.docker_engine import containers_of, require_docker_image
from tests.processes import wait_until
from tests.stacks import RunningStack, running_stack
from tests.stage_calls import command_task

DOCKER = {"runtime": {"backend": "docker"}}


@pytest.fixture(scope="module", autouse=True)
def docker_image() -> None:
    require_docker_image()


def _running_session(stack, task_id: str) -> object:  # type: ignore[no-untyped-def]
    rows = wait_until(
        lambda: stack.sql("SELECT id FROM sessions WHERE task_id = :t AND state = 'running'", t=task_id),
        timeout_s=120,
        message=f"{task_id} to run",
    )
    return rows[0][0]


def test_a_session_runs_inside_its_container(shared_stack: RunningStack, tmp_path: Path) -> None:
    stack = shared_stack
    host_only = tmp_path / "host-only.txt"
    host_only.write_text("the host sees this")
    # Exits 0 only inside a container that cannot see the host's files.
    command = f"test -f /.dockerenv && test ! -e {host_only} && echo inside > marker.txt && sleep 2"
    submitted = stack.client.submit({"tasks": [command_task("in-docker", command, **DOCKER)]})
    session_id = _running_session(stack, "in-docker")
    assert len(containers_of(session_id)) == 1  # created by init, running now
    final = stack.wait(submitted["batch_id"], timeout_s=300)
    errors = stack.sql("SELECT error FROM sessions WHERE batch_id = :b", b=submitted["batch_id"])
    assert final["counts"] == {"completed": 1}, errors
    wait_until(lambda: containers_of(session_id) == [], timeout_s=120, message="postrun to remove the container")


def test_a_killed_run_worker_still_ends_terminal_and_removes_the_container(
    database_url: str, broker_url: str, tmp_path: Path
) -> None:
    env = {"POLAR_VISIBILITY_TIMEOUT": "6"}
    with running_stack(database_url, broker_url, tmp_path, run_concurrency=1, env=env) as stack:
        # Slow on the first attempt only: the attempt after one lost to the infrastructure finishes at once.
        victim = command_task("victim", 'test "$POLAR_ATTEMPT" != 1 || sleep 120', **DOCKER)
        submitted = stack.client.submit({"tasks": [victim]})
        session_id = _running_session(stack, "victim")
        assert len(containers_of(session_id)) == 1
        stack.stack.signal("worker-run", signal.SIGKILL)
        stack.stack.processes["worker-run"].wait()
        stack.stack.start_one("worker-run")

        final = stack.wait(submitted["batch_id"], timeout_s=300)
        assert final["counts"] == {"completed": 1} and final["attempts"]["retried"] == 1
        (row,) = stack.sql("SELECT state, outcome, retried_as FROM sessions WHERE id = :id", id=session_id)
        assert row.state == "failed" and row.outcome == "worker_lost"
        both = (session_id, row.retried_as)
        wait_until(lambda: all(containers_of(s) == [] for s in both), timeout_s=120, message="containers to go")
