"""Harbor task folders as one Polar batch in Docker, through ``polar submit --harbor`` against a whole stack (API,
stage workers, proxy, the reference engine answering the tasks with its ``tool_user`` policy: the test process's
shared stack).

``tests/e2e/harbor_tasks`` holds seven task folders, each read first by Harbor's own task model (the ``harbor``
package). Each environment is built locally from its Dockerfile (``FROM polar-test:latest``, no registry):

- with ``--harness oracle`` every task runs its ``solution/solve.sh``: the five solvable tasks score 1.0 (rewards
  read from ``reward.txt`` and from ``reward.json``), ``broken-solution`` scores 0.0, and ``stale-reward``, whose
  "solution" plants rewards of 1 in ``/logs/verifier`` and a verifier of its own in ``/tests``, scores 0.0;
- with ``--harness oracle --harness TASK=NAME ...`` four tasks each run a different real CLI (pi, codex, Claude
  Code, Gemini CLI) in the task's container, every captured call token-exact against the engine.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from polar.harbor import find_task_folders, read_task_folder
from polar.harbor.images import image_tag, task_image
from polar.harnesses.install import install
from polar.local.cli import main
from tests.docker_engine import containers_of, require_docker_image
from tests.e2e.file_task import wait_finished
from tests.harbor_model import harbor_reads
from tests.stacks import RunningStack

pytestmark = [pytest.mark.long(seconds=109), pytest.mark.timeout(1500)]

TASKS = Path(__file__).resolve().parent / "harbor_tasks"
CLIS = {"hello-pi": "pi", "hello-codex": "codex", "hello-claude": "claude_code", "hello-gemini": "gemini_cli"}
SOLVABLE = ("count-lines", "hello-claude", "hello-codex", "hello-gemini", "hello-pi")


def submit(stack: RunningStack, *args: str) -> str:
    runner = CliRunner(env={"POLAR_API_TOKEN": stack.api_token, "POLAR_API_URL": stack.api_url})
    done = runner.invoke(main, ["submit", "--harbor", str(TASKS), *args], catch_exceptions=False)
    assert done.exit_code == 0, done.output
    return str(json.loads(done.output.strip().splitlines()[0])["batch_id"])


@pytest.fixture(scope="module")
def results(shared_stack: RunningStack) -> dict[str, Any]:
    require_docker_image()
    install(CLIS.values())
    stack = shared_stack
    per_task = [arg for task, cli in CLIS.items() for arg in ("--harness", f"{task}={cli}")]
    mixed = submit(stack, "--harness", "oracle", *per_task)
    oracle = submit(stack, "--harness", "oracle", "--wait")
    wait_finished(stack, mixed, timeout_s=900)
    found: dict[str, Any] = {"stack": stack, "engine": stack.engine_entries()}
    for name, batch_id in (("oracle", oracle), ("mixed", mixed)):
        found[name] = {s["task_id"]: s for s in stack.client.sessions(batch_id)}
    return found


def test_harbor_reads_every_folder_as_polar_does() -> None:
    folders = find_task_folders(TASKS)
    assert len(folders) == 7
    for read in harbor_reads(folders):
        ours = read_task_folder(Path(read["path"]))
        assert read["instruction"] == ours.instruction
        assert (read["agent_timeout_sec"], read["verifier_timeout_sec"]) == (
            ours.agent_timeout_s, ours.verifier_timeout_s,
        )  # fmt: skip
        assert read["test"].endswith("tests/test.sh") and read["solve"].endswith("solution/solve.sh")


def details(session: dict[str, Any]) -> str:
    evaluation = session.get("evaluation") or {}
    verifier = evaluation.get("verifier") or {}
    head = f"{session['task_id']}: {session['state']} reward={session['reward']} error={session['error']!r}"
    return f"{head}\nverifier: {verifier.get('output_tail')!r}\nharness log:\n{evaluation.get('harness_log', '')}"


def test_each_solvable_tasks_oracle_scores_one(results: dict[str, Any]) -> None:
    sessions = results["oracle"]
    assert sorted(sessions) == sorted([*SOLVABLE, "broken-solution", "stale-reward"])
    for task in SOLVABLE:
        assert (sessions[task]["state"], sessions[task]["reward"]) == ("completed", 1.0), details(sessions[task])
    files = {task: sessions[task]["evaluation"]["file"] for task in SOLVABLE}
    assert files["hello-pi"] == "logs/verifier/reward.txt" and files["hello-codex"] == "logs/verifier/reward.json"
    assert sessions["count-lines"]["evaluation"]["rewards"] == {"reward": 1.0, "lines": 3.0}


def test_a_broken_solution_scores_zero(results: dict[str, Any]) -> None:
    session = results["oracle"]["broken-solution"]
    assert (session["state"], session["reward"]) == ("completed", 0.0), details(session)


def test_a_stale_reward_is_never_read(results: dict[str, Any]) -> None:
    session = results["oracle"]["stale-reward"]
    assert (session["state"], session["reward"]) == ("completed", 0.0), details(session)
    # The planted reward.json (read first, had it survived) is gone; the real verifier, not the planted one, ran.
    assert session["evaluation"]["file"] == "logs/verifier/reward.txt"


@pytest.mark.parametrize("task", sorted(CLIS))
def test_a_real_cli_per_task_in_the_tasks_container_token_exactly(task: str, results: dict[str, Any]) -> None:
    session = results["mixed"][task]
    assert (session["state"], session["reward"]) == ("completed", 1.0), details(session)
    stack: RunningStack = results["stack"]
    calls = stack.client.calls(session["session_id"])
    assert len(calls) >= 2, details(session)
    for call in calls:
        served = results["engine"][call["response"]["id"]]
        assert call["status_code"] == 200
        assert call["prompt_token_ids"] == served["prompt_token_ids"]
        assert call["completion_token_ids"] == served["token_ids"]
    assert stack.client.trajectories(session["session_id"])
    assert containers_of(session["session_id"]) == []


def test_the_rest_of_the_mixed_batch_ran_the_oracle(results: dict[str, Any]) -> None:
    sessions = results["mixed"]
    assert sorted(sessions) == sorted([*SOLVABLE, "broken-solution", "stale-reward"])
    assert sessions["count-lines"]["reward"] == 1.0 and sessions["broken-solution"]["reward"] == 0.0


def test_the_image_is_cached_by_the_content_of_environment(tmp_path: Path, results: dict[str, Any]) -> None:
    folder = read_task_folder(TASKS / "hello-pi")
    assert task_image(folder) == image_tag(folder)  # built by the batches: reused, not rebuilt
    copy = tmp_path / "hello-pi"
    shutil.copytree(TASKS / "hello-pi", copy)
    assert image_tag(read_task_folder(copy)) == image_tag(folder)  # the same content, wherever it lies
    (copy / "environment" / "Dockerfile").write_text("FROM polar-test:latest\nWORKDIR /srv\n")
    changed = read_task_folder(copy)
    assert image_tag(changed) != image_tag(folder)
    assert task_image(changed) == image_tag(changed)
