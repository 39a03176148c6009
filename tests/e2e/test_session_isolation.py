"""Sessions inherit nothing of the directory Polar was started from. Polar runs (with its default state and work
directories) from inside a project whose pytest settings say ``--import-mode=importlib``; a SWE-bench-format
repository whose tests import a module next to them must still score 1.0 under the ``swebench`` evaluator, in the
``local``, ``bwrap`` and ``docker`` runtimes. With session directories under the start directory (the old default
``.polar/sessions``), pytest climbed out of the session into that project's configuration and the import failed."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest

from polar.config import default_work_root, deployment_id
from tests.docker_engine import require_docker_image
from tests.support import running_stack
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


@pytest.mark.parametrize("backend", ["local", "bwrap", "docker"])
def test_a_project_around_polar_reaches_no_session(
    backend: str, database_url: str, broker_url: str, tmp_path: Path
) -> None:
    if backend == "docker":
        require_docker_image()
    swe = build_swe_repo(tmp_path / "origin", neighbour_module=True)
    host = tmp_path / "host-project"  # where the user started Polar: a project of theirs
    host.mkdir()
    (host / "pyproject.toml").write_text(HOST_PYPROJECT)
    env = {"POLAR_NODE": f"isolation-{uuid.uuid4().hex[:8]}"}  # Docker's reaper: our containers are ours alone
    work_root = default_work_root(deployment_id(database_url))
    try:
        with running_stack(database_url, broker_url, tmp_path, env=env, cwd=host) as stack:
            submitted = stack.client.submit({"tasks": [_task(swe, backend)]})
            stack.wait(submitted["batch_id"])
            (session,) = stack.client.sessions(submitted["batch_id"])
            evaluation = session.get("evaluation") or {}
            assert (session["state"], session["reward"]) == ("completed", 1.0), (
                session["error"],
                evaluation.get("log_tail"),
            )
            assert evaluation["resolution_status"] == "RESOLVED_FULL"
        assert not (host / ".polar" / "sessions").exists()  # no session ever lived under the start directory
    finally:
        shutil.rmtree(work_root.parent, ignore_errors=True)
