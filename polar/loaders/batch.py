"""A batch body (``{"name", "defaults", "tasks"}``, DESIGN.md §3) from a data file, validated before it is sent.

    batch = load_batch(Path("tasks.jsonl"), template=Path("task.template.json"), samples=4, limit=100)
    batch = load_batch(Path("swe.jsonl"), swebench=True, defaults={"harness": {"name": "claude_code"}})
    batch = load_batch(Path("batch.yaml"))                       # a ready batch, overrides still apply

The loaders make tasks from rows; everything shared by every task (harness, timeout, prepare steps, ...) belongs in
the batch ``defaults``, which the API merges under each task (a task's own values win). ``samples`` is the one
override that beats the tasks: it sets every task's ``num_samples``. Validation runs here with the API's own
rules, so a bad row is reported as ``file:line`` before anything is submitted (evaluator names are checked by the
API, which knows the installed ones).
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from polar.contract.task_request import parse_batch_request
from polar.errors import ValidationError
from polar.loaders.rows import read_jsonl
from polar.loaders.swebench import tasks_from_swebench
from polar.loaders.template import tasks_from_template
from polar.protocols.images import sniffed_type

_TASK_FIELD = re.compile(r"tasks\[(\d+)\]\.?")


def read_mapping(source: str | Path, what: str) -> dict[str, Any]:
    """A JSON or YAML object from a file (YAML when it ends in .yaml/.yml), or from inline JSON text."""
    path = Path(source)
    inline = isinstance(source, str) and source.lstrip().startswith("{")
    language = "YAML" if not inline and path.suffix in {".yaml", ".yml"} else "JSON"
    try:
        text = str(source) if inline else path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValidationError(f"{what}: cannot read {source}: {exc}", field=what) from exc
    try:
        value = yaml.safe_load(text) if language == "YAML" else json.loads(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise ValidationError(f"{what}: not valid {language}: {exc}", field=what) from exc
    if not isinstance(value, dict):
        raise ValidationError(f"{what}: must be a JSON/YAML object, got {type(value).__name__}", field=what)
    return value


def _overlay(base: Mapping[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in top.items():
        below = merged.get(key)
        merged[key] = _overlay(below, value) if isinstance(below, Mapping) and isinstance(value, Mapping) else value
    return merged


def _located(exc: ValidationError, wheres: Sequence[str]) -> ValidationError:
    """``exc`` about ``tasks[i].field`` reworded as ``file:line: field``, the place a person edits."""
    match = _TASK_FIELD.match(exc.field or "")
    if match is None or int(match.group(1)) >= len(wheres):
        return exc
    where = wheres[int(match.group(1))]
    message = exc.message.removeprefix(match.group(0)).lstrip(": ")
    if message.endswith("required field is missing"):
        message += " (give it in the template, or for every task in the batch defaults)"
    return ValidationError(f"{where}: {message}", field=where)


def make_batch(
    tasks: Sequence[Mapping[str, Any]],
    *,
    wheres: Sequence[str] = (),
    name: str | None = None,
    defaults: Mapping[str, Any] | None = None,
    samples: int | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The batch body for ``tasks``, validated as the API would (``wheres[i]`` names task i's row in errors)."""
    if not tasks:
        raise ValidationError("tasks: no tasks to submit (the data has no rows)", field="tasks")
    body: dict[str, Any] = dict(extra or {})
    if name is not None:
        body["name"] = name
    if defaults:
        body["defaults"] = dict(defaults)
    body["tasks"] = [dict(task) if samples is None else {**task, "num_samples": samples} for task in tasks]
    try:
        parse_batch_request(body)
    except ValidationError as exc:
        raise _located(exc, wheres) from exc
    return body


def _batch_file(path: Path, limit: int | None) -> tuple[list[Any], dict[str, Any]]:
    batch = read_mapping(path, str(path))
    tasks = batch.pop("tasks", None)
    if not isinstance(tasks, list):
        raise ValidationError(f"{path}: a batch needs a 'tasks' list", field="tasks")
    return tasks[:limit] if limit is not None else tasks, batch


def _inline_images(task: dict[str, Any], base: Path) -> dict[str, Any]:
    """A task whose ``images`` name files relative to its rows' file (``red.png``) with those files as data URLs:
    the submitting machine reads them, so the API needs no copy root for them. Absolute paths and data URLs stay."""
    images = task.get("images")
    if not isinstance(images, list) or not any(_relative(image) for image in images):
        return task
    inlined = []
    for index, image in enumerate(images):
        if not _relative(image):
            inlined.append(image)
            continue
        path = base / image
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise ValidationError(f"images[{index}]: cannot read {path}: {exc}", field="images") from exc
        kind = sniffed_type(data)
        if kind is None:
            raise ValidationError(f"images[{index}]: {path} is not a PNG, JPEG, GIF or WEBP image", field="images")
        inlined.append(f"data:{kind};base64,{base64.b64encode(data).decode('ascii')}")
    return {**task, "images": inlined}


def _relative(image: Any) -> bool:
    return isinstance(image, str) and bool(image) and not image.startswith(("data:", "/"))


def load_batch(
    data: Path,
    *,
    template: Path | None = None,
    swebench: bool = False,
    image_template: str | None = None,
    defaults: Mapping[str, Any] | None = None,
    samples: int | None = None,
    limit: int | None = None,
    name: str | None = None,
) -> dict[str, Any]:
    """A validated batch body from ``data``: JSONL rows through ``template`` or as SWE-bench instances, else a
    JSON/YAML batch. ``limit`` keeps the first rows (or tasks), ``defaults`` go under every task (over a batch
    file's own), ``name`` defaults to the file's stem."""
    if template is not None and swebench:
        raise ValidationError("give a template or swebench, not both", field="template")
    if template is None and not swebench:
        tasks, extra = _batch_file(data, limit)
        merged = _overlay(extra.pop("defaults", None) or {}, defaults or {})
        return make_batch(tasks, name=name or extra.pop("name", None), defaults=merged, samples=samples, extra=extra)
    rows = read_jsonl(data, limit)
    if template is not None:
        try:
            text = template.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ValidationError(f"{template}: cannot read: {exc}", field="template") from exc
        tasks = [_inline_images(task, data.parent) for task in tasks_from_template(rows, text, str(template))]
    else:
        tasks = tasks_from_swebench(rows, image_template)
    wheres = [row.where for row in rows]
    return make_batch(tasks, wheres=wheres, name=name or data.stem, defaults=defaults, samples=samples)
