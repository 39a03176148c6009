"""Harbor task folders: the dataset layouts found, what a folder is read as, what is refused and why, and the task
request the loader makes of one (the image build and a whole batch run in tests/e2e/test_harbor.py)."""

from __future__ import annotations

import base64
import shutil
from pathlib import Path

import pytest

from polar.contract.task_request import HarnessSpec, parse_batch_request
from polar.errors import ValidationError
from polar.harbor import find_task_folders, pack, read_task_folder
from polar.harnesses.registry import check_harness
from polar.loaders import harbor_task

TASKS = Path(__file__).resolve().parents[2] / "e2e" / "harbor_tasks"


def copy_task(tmp_path: Path, name: str = "hello-pi", to: str = "hello-pi") -> Path:
    return Path(shutil.copytree(TASKS / name, tmp_path / to))


def test_the_layouts_datasets_use(tmp_path: Path) -> None:
    one = copy_task(tmp_path / "single")
    assert find_task_folders(one) == [one]
    flat = [copy_task(tmp_path / "flat", to=name) for name in ("b-task", "a-task")]
    assert find_task_folders(tmp_path / "flat") == sorted(flat)
    deep = copy_task(tmp_path / "registry" / "my-dataset" / "1.0", to="deep-task")
    (tmp_path / "registry" / ".git" / "x").mkdir(parents=True)
    assert find_task_folders(tmp_path / "registry") == [deep]
    with pytest.raises(ValidationError, match="no Harbor task folder"):
        find_task_folders(tmp_path / "registry" / ".git")


def test_a_folder_as_read(tmp_path: Path) -> None:
    folder = copy_task(tmp_path)
    (folder / "instruction.md").write_text("<!-- harbor-canary GUID 1234 -->\n\nCreate hello.txt containing x\n")
    (folder / "task.toml").write_text(
        '[task]\nname = "org/hello"\n[metadata]\ndifficulty = "easy"\n[agent]\ntimeout_sec = 90\n'
        '[verifier]\ntimeout_sec = 30\nenv = { MODE = "strict" }\n[solution]\nenv = { SEED = "1" }\n'
        '[environment]\ncpus = 2\nmemory_mb = 1024\nworkdir = "/srv"\nenv = { LANG = "C.UTF-8" }\n'
    )
    task = read_task_folder(folder)
    assert task.name == "hello-pi" and task.instruction == "Create hello.txt containing x\n"
    assert (task.agent_timeout_s, task.verifier_timeout_s, task.cpus, task.memory_mb) == (90, 30, 2, 1024)
    assert (task.verifier_env, task.solution_env, task.environment_env) == (
        {"MODE": "strict"}, {"SEED": "1"}, {"LANG": "C.UTF-8"},
    )  # fmt: skip
    assert task.workdir == "/srv" and task.metadata == {"difficulty": "easy", "harbor_name": "org/hello"}

    request = harbor_task(task, "oracle", "polar-harbor/hello-pi:abc", task.workdir)
    assert request["task_id"] == "hello-pi" and request["timeout_seconds"] == 90
    assert request["runtime"] == {"backend": "docker", "image": "polar-harbor/hello-pi:abc", "workdir": "/srv",
                                  "env": {"LANG": "C.UTF-8"}, "limits": {"cpus": 2, "memory_mb": 1024}}  # fmt: skip
    assert request["harness"]["env"] == {"SEED": "1"}
    solve = {entry["path"]: entry for entry in request["harness"]["settings"]["solution"]}["solve.sh"]
    assert base64.b64decode(solve["content"]) == (folder / "solution" / "solve.sh").read_bytes()
    assert solve["executable"] is True
    config = request["evaluator"]["config"]
    assert (config["timeout_seconds"], config["env"]) == (30, {"MODE": "strict"})
    assert [entry["path"] for entry in config["tests"]] == ["test.sh"]
    parse_batch_request({"tasks": [request]})  # the API's own rules accept it


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda f: (f / "tests" / "test.sh").unlink(), "tests/test.sh is missing"),
        (lambda f: (f / "environment" / "Dockerfile").unlink(), "environment/Dockerfile is missing"),
        (lambda f: (f / "environment" / "Dockerfile").rename(f / "environment" / "docker-compose.yaml"),
         "compose environments are not supported"),
        (lambda f: (f / "task.toml").write_text('[[steps]]\nname = "one"\n'), "multi-step tasks"),
        (lambda f: (f / "task.toml").write_text('[environment]\nos = "windows"\n'), "only Linux tasks"),
        (lambda f: (f / "task.toml").write_text("[agent\n"), "not valid TOML"),
        (lambda f: (f / "task.toml").write_text("[agent]\ntimeout_sec = -1\n"), "timeout_sec must be a positive"),
        (lambda f: (f / "instruction.md").unlink(), "cannot read the task folder"),
    ],
)  # fmt: skip
def test_what_is_refused(tmp_path: Path, change: object, message: str) -> None:
    folder = copy_task(tmp_path)
    change(folder)  # type: ignore[operator]
    with pytest.raises(ValidationError, match=message):
        read_task_folder(folder)


def test_a_prebuilt_image_needs_no_dockerfile(tmp_path: Path) -> None:
    folder = copy_task(tmp_path)
    shutil.rmtree(folder / "environment")
    (folder / "task.toml").write_text('[environment]\ndocker_image = "polar-test:latest"\n')
    assert read_task_folder(folder).docker_image == "polar-test:latest"


def test_the_oracle_needs_a_solution(tmp_path: Path) -> None:
    folder = copy_task(tmp_path)
    shutil.rmtree(folder / "solution")
    with pytest.raises(ValidationError, match=r"no solution/solve\.sh"):
        harbor_task(read_task_folder(folder), "oracle", "img", None)
    with pytest.raises(ValidationError, match=r"tasks\[0\].harness.settings.solution: holds no solve.sh"):
        check_harness(HarnessSpec(name="oracle"), "tasks[0].harness")
    with pytest.raises(ValidationError, match="unknown settings"):
        check_harness(HarnessSpec(name="oracle", settings={"solution": [], "x": 1}), "tasks[0].harness")


def test_links_are_not_carried(tmp_path: Path) -> None:
    folder = copy_task(tmp_path)
    (folder / "tests" / "secret").symlink_to("/etc/hostname")
    with pytest.raises(ValidationError, match="only plain files"):
        pack(folder / "tests")
