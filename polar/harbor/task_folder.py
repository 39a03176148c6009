"""Harbor task folders on disk: what one holds and where they are under a dataset directory.

A task folder (Harbor's format, as its ``harbor.models.task`` reads it):

    task.toml          metadata, [agent] timeout_sec, [verifier] timeout_sec/env, [environment] cpus/memory_mb/
                       docker_image/workdir/env, [solution] env
    instruction.md     what the agent is asked
    environment/       a Dockerfile (and its build context), unless task.toml names a prebuilt docker_image
    tests/test.sh      the verifier: writes /logs/verifier/reward.json or reward.txt
    solution/solve.sh  optional: a reference solution (the ``oracle`` harness runs it)

``find_task_folders`` accepts the layouts Harbor's datasets use: a task folder itself, a directory of task folders
(``terminal-bench/``), or a dataset whose tasks sit one or two levels down (``tasks/<name>/``, a registry's
``<dataset>/<version>/<name>/``). Multi-step tasks (``steps`` in task.toml), compose environments and Windows
tasks are refused with the reason.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from polar.errors import ValidationError

CONFIG = "task.toml"
MAX_DEPTH = 3


@dataclass(frozen=True)
class TaskFolder:
    """One Harbor task folder, read and checked."""

    path: Path
    name: str
    instruction: str
    agent_timeout_s: float | None
    verifier_timeout_s: float
    verifier_env: dict[str, str] = field(default_factory=dict)
    solution_env: dict[str, str] = field(default_factory=dict)
    environment_env: dict[str, str] = field(default_factory=dict)
    docker_image: str | None = None
    workdir: str | None = None
    cpus: float | None = None
    memory_mb: int | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def environment_dir(self) -> Path:
        return self.path / "environment"

    @property
    def tests_dir(self) -> Path:
        return self.path / "tests"

    @property
    def solution_dir(self) -> Path:
        return self.path / "solution"

    @property
    def has_solution(self) -> bool:
        return (self.solution_dir / "solve.sh").is_file()


def find_task_folders(root: Path) -> list[Path]:
    """The task folders at or under ``root`` (sorted; none below a task folder); ValidationError when none."""
    if not root.is_dir():
        raise ValidationError(f"{root}: not a directory", field="harbor")
    if (root / CONFIG).is_file():
        return [root]
    found: list[Path] = []
    level = [root]
    for _ in range(MAX_DEPTH):
        below = sorted(child for parent in level for child in parent.iterdir() if child.is_dir())
        below = [child for child in below if not child.name.startswith(".")]
        found += [child for child in below if (child / CONFIG).is_file()]
        level = [child for child in below if not (child / CONFIG).is_file()]
    if not found:
        raise ValidationError(f"{root}: no Harbor task folder (one holding {CONFIG}) here or below", field="harbor")
    return sorted(found)


def _table(config: dict[str, Any], name: str, where: str) -> dict[str, Any]:
    table = config.get(name, {})
    if not isinstance(table, dict):
        raise ValidationError(f"{where}: [{name}] must be a table", field=where)
    return table


def _strings(table: dict[str, Any], key: str, where: str) -> dict[str, str]:
    value = table.get(key, {})
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise ValidationError(f"{where}: {key} must be a table of strings", field=where)
    return {str(k): v for k, v in value.items()}


def _number(table: dict[str, Any], key: str, where: str) -> float | None:
    value = table.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ValidationError(f"{where}: {key} must be a positive number", field=where)
    return float(value)


def read_task_folder(path: Path) -> TaskFolder:
    """The task folder at ``path``; ValidationError naming the file and what is wrong or unsupported."""
    where = str(path / CONFIG)
    try:
        config = tomllib.loads((path / CONFIG).read_text(encoding="utf-8"))
        instruction = (path / "instruction.md").read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValidationError(f"{path}: cannot read the task folder: {exc}", field=str(path)) from exc
    except tomllib.TOMLDecodeError as exc:
        raise ValidationError(f"{where}: not valid TOML: {exc}", field=where) from exc
    if config.get("steps"):
        raise ValidationError(f"{where}: multi-step tasks ([[steps]]) are not supported", field=where)
    agent, verifier = _table(config, "agent", where), _table(config, "verifier", where)
    environment, solution = _table(config, "environment", where), _table(config, "solution", where)
    if str(environment.get("os", "linux")).lower() != "linux":
        raise ValidationError(f"{where}: only Linux tasks run here (environment.os {environment['os']!r})", field=where)
    image = environment.get("docker_image")
    if image is not None and not isinstance(image, str):
        raise ValidationError(f"{where}: environment.docker_image must be a string", field=where)
    if image is None and not (path / "environment" / "Dockerfile").is_file():
        compose = any((path / "environment" / n).exists() for n in ("docker-compose.yaml", "docker-compose.yml"))
        why = "compose environments are not supported" if compose else "environment/Dockerfile is missing"
        raise ValidationError(f"{path}: {why} (and task.toml names no environment.docker_image)", field=str(path))
    if not (path / "tests" / "test.sh").is_file():
        raise ValidationError(f"{path}: tests/test.sh is missing", field=str(path))
    memory = _number(environment, "memory_mb", where)
    workdir = environment.get("workdir")
    package = config.get("task") if isinstance(config.get("task"), dict) else {}
    metadata = dict(config.get("metadata") or {})
    if package.get("name"):
        metadata["harbor_name"] = str(package["name"])
    return TaskFolder(
        path=path,
        name=path.name,
        instruction=_strip_canary(instruction),
        agent_timeout_s=_number(agent, "timeout_sec", where),
        verifier_timeout_s=_number(verifier, "timeout_sec", where) or 600.0,
        verifier_env=_strings(verifier, "env", where),
        solution_env=_strings(solution, "env", where),
        environment_env=_strings(environment, "env", where),
        docker_image=image,
        workdir=workdir if isinstance(workdir, str) and workdir else None,
        cpus=_number(environment, "cpus", where),
        memory_mb=int(memory) if memory is not None else None,
        metadata=metadata,
    )


def _strip_canary(text: str) -> str:
    """The instruction without the leading canary comment lines datasets carry against training contamination
    (Harbor hides them from agents too)."""
    lines = text.split("\n")
    index = 0
    while index < len(lines) and "canary" in lines[index].lower() and lines[index].strip().startswith(("#", "<!--")):
        index += 1
    while index < len(lines) and not lines[index].strip():
        index += 1
    return "\n".join(lines[index:])
