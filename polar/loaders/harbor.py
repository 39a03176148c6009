"""Tasks from Harbor task folders (Terminal-Bench 2.0, SWE-bench in Harbor form, any Harbor dataset): one Docker
task per folder, its environment built locally, graded by the folder's own verifier.

    batch = load_harbor(Path("terminal-bench"), harness="oracle")                  # every task's solve.sh
    batch = load_harbor(Path("tasks"), harness="pi", per_task={"hello": "codex"})  # one task on another harness

Each folder (``polar.harbor.task_folder``) becomes:

    {"task_id": <folder name>, "instruction": <instruction.md>,
     "timeout_seconds": [agent] timeout_sec (else the batch default),
     "runtime": {"backend": "docker", "image": <built from environment/, polar.harbor.images>,
                 "workdir": [environment] workdir or the image's WORKDIR, "env": [environment] env,
                 "limits": {"cpus", "memory_mb"}},
     "harness": {"name": <harness>} (``oracle``: with the folder's solution/ and [solution] env),
     "evaluator": {"name": "harbor", "config": {"tests": <tests/>, "timeout_seconds": [verifier] timeout_sec,
                                                "env": [verifier] env}},
     "metadata": {"harbor_task": <folder name>, ...task.toml's [metadata]}}
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from polar.errors import ValidationError
from polar.harbor.bundle import pack
from polar.harbor.images import image_workdir, task_image
from polar.harbor.task_folder import TaskFolder, find_task_folders, read_task_folder
from polar.loaders.batch import make_batch

ImageBuilder = Callable[[TaskFolder], str]


def harbor_task(folder: TaskFolder, harness: str, image: str, workdir: str | None) -> dict[str, Any]:
    """The task request of one task folder run by ``harness`` in ``image`` (see the module docstring)."""
    spec: dict[str, Any] = {"name": harness}
    if harness == "oracle":
        if not folder.has_solution:
            raise ValidationError(f"{folder.path}: no solution/solve.sh, so the oracle cannot run it", field="harness")
        spec["settings"] = {"solution": pack(folder.solution_dir)}
        if folder.solution_env:
            spec["env"] = dict(folder.solution_env)
    runtime: dict[str, Any] = {"backend": "docker", "image": image}
    if workdir:
        runtime["workdir"] = workdir
    if folder.environment_env:
        runtime["env"] = dict(folder.environment_env)
    limits = {key: value for key, value in (("cpus", folder.cpus), ("memory_mb", folder.memory_mb)) if value}
    if limits:
        runtime["limits"] = limits
    verifier = {"tests": pack(folder.tests_dir), "timeout_seconds": folder.verifier_timeout_s,
                "env": dict(folder.verifier_env)}  # fmt: skip
    task: dict[str, Any] = {
        "task_id": folder.name,
        "instruction": folder.instruction,
        "runtime": runtime,
        "harness": spec,
        "evaluator": {"name": "harbor", "config": verifier},
        "metadata": {**folder.metadata, "harbor_task": folder.name},
    }
    if folder.agent_timeout_s is not None:
        task["timeout_seconds"] = folder.agent_timeout_s
    return task


def load_harbor(
    root: Path,
    *,
    harness: str | None = None,
    per_task: Mapping[str, str] | None = None,
    defaults: Mapping[str, Any] | None = None,
    samples: int | None = None,
    limit: int | None = None,
    name: str | None = None,
    build: ImageBuilder = task_image,
) -> dict[str, Any]:
    """A validated batch of every task folder at or under ``root``, each built into its image (``build``). The
    harness is ``per_task[<folder name>]``, else ``harness``, else the one ``defaults`` names."""
    per_task = dict(per_task or {})
    folders = [read_task_folder(path) for path in find_task_folders(root)][:limit]
    unknown = sorted(set(per_task) - {folder.name for folder in folders})
    if unknown:
        raise ValidationError(f"--harness names tasks that are not under {root}: {', '.join(unknown)}", field="harness")
    fallback = harness or ((defaults or {}).get("harness") or {}).get("name")
    if fallback is None and len(per_task) < len(folders):
        raise ValidationError("name a harness (--harness NAME, or harness in --defaults)", field="harness")
    tasks, wheres = [], []
    for folder in folders:
        image = build(folder)
        workdir = folder.workdir or image_workdir(image)
        tasks.append(harbor_task(folder, per_task.get(folder.name) or str(fallback), image, workdir))
        wheres.append(str(folder.path))
    return make_batch(tasks, wheres=wheres, name=name or root.resolve().name, defaults=defaults, samples=samples)
