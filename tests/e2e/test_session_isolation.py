"""Sessions inherit nothing of the directory Polar was started from. Polar runs (with its default state and work
directories) from inside a project whose pytest settings say ``--import-mode=importlib``; a SWE-bench-format
repository whose tests import a module next to them must still score 1.0 under the ``swebench`` evaluator, in the
``local``, ``bwrap`` and ``docker`` runtimes. With session directories under the start directory (the old default
``.polar/sessions``), pytest climbed out of the session into that project's configuration and the import failed."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from polar.config import default_work_root, deployment_id
from tests.docker_engine import require_docker_image
from tests.stacks import running_stack
from tests.swebench_repo import FIXED, TEST_CMD, SweRepo, build_swe_repo

HOST_PYPROJECT = (
    '[project]\nname = "host"\nversion = "0"\n\n[tool.pytest.ini_options]\naddopts = "--import-mode=importlib"\n'
)


def _task(swe: SweRepo, backend: str) -> dict[str, Any]:
    # No model needed: the harness writes the right fix itself, and git must not see the host project either.
    fix = FIXED.replace("\n", "\\n")
    return {
        "task_id": backend,
        "instruction": "fix mul",
        "timeout_seconds": 180,
        "runtime": {"backend": backend, "prepare": swe.prepare_steps()},
        "harness": {"name": "command", "command": f"printf '{fix}' > calc.py && git rev-parse --show-toplevel"},
        "evaluator": {
            "name": "swebench",
            "config": {"instance": swe.instance, "repo_dir": ".", "test_cmd": TEST_CMD, "timeout_seconds": 120},
        },
    }


BACKENDS = ("local", "bwrap", "docker")


@pytest.fixture(scope="module")
def isolated(
    module_database_url: str, module_broker_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[dict[str, dict[str, Any]], Path]]:
    """One stack started from inside the host project runs the task once in each runtime (Docker's when an engine
    answers): the sessions by runtime, and the host project."""
    tmp = tmp_path_factory.mktemp("isolation")
    try:
        require_docker_image()
        backends = BACKENDS
    except pytest.skip.Exception:  # its test skips, loudly; the others run
        backends = BACKENDS[:2]
    swe = build_swe_repo(tmp / "origin", neighbour_module=True)
    host = tmp / "host-project"  # where the user started Polar: a project of theirs
    host.mkdir()
    (host / "pyproject.toml").write_text(HOST_PYPROJECT)
    env = {"POLAR_NODE": f"isolation-{uuid.uuid4().hex[:8]}"}  # Docker's reaper: our containers are ours alone
    work_root = default_work_root(deployment_id(module_database_url))
    try:
        with running_stack(module_database_url, module_broker_url, tmp, env=env, cwd=host) as stack:
            submitted = stack.client.submit({"tasks": [_task(swe, backend) for backend in backends]})
            stack.wait(submitted["batch_id"])
            sessions = {session["task_id"]: session for session in stack.client.sessions(submitted["batch_id"])}
        yield sessions, host
    finally:
        shutil.rmtree(work_root.parent, ignore_errors=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_project_around_polar_reaches_no_session(
    backend: str, isolated: tuple[dict[str, dict[str, Any]], Path]
) -> None:
    if backend == "docker":
        require_docker_image()
    sessions, host = isolated
    session = sessions[backend]
    evaluation = session.get("evaluation") or {}
    assert (session["state"], session["reward"]) == ("completed", 1.0), (session["error"], evaluation.get("log_tail"))
    assert evaluation["resolution_status"] == "RESOLVED_FULL"
    assert not (host / ".polar" / "sessions").exists()  # no session ever lived under the start directory
