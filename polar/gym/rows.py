"""A NeMo Gym dataset row, checked, and the Polar task it becomes.

A row is what NeMo RL posts to ``/run``: ``responses_create_params`` (the Responses-API request: ``input`` and
sampling fields) plus the row's own fields, echoed back in the answer (``agent_ref``, ``_ng_task_index``,
``_ng_rollout_index``, ``_rowidx``, whatever the dataset carries for its verifier). The operator's template (a
TaskRequest written as JSON with Jinja2, as for ``polar generate``, ``polar.loaders.template``) renders it; its
variables are the row's fields, ``row``, and ``instruction``: the text of the row's last user message.

    task = row_task(template, row)     # a dict; ``checked_task`` also validates it alone
    batch = rows_batch(tasks)          # many rows' tasks as one BatchRequest, one session each, in order
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jinja2

from polar.codec.json_body import check_storable
from polar.contract.task_request import BatchRequest, parse_batch_request
from polar.errors import ValidationError
from polar.loaders.rows import Row
from polar.loaders.template import render_task

BATCH_NAME = "nemo-gym"


def check_row(body: Any) -> dict[str, Any]:
    """``body`` if it is a row ``/run`` can run: a JSON object whose ``responses_create_params`` is an object with
    an ``input``; ValidationError saying what is missing otherwise."""
    if not isinstance(body, dict):
        raise ValidationError("a /run body is a dataset row: a JSON object", field="body")
    params = body.get("responses_create_params")
    if not isinstance(params, dict):
        raise ValidationError("responses_create_params: required, an object", field="responses_create_params")
    if not isinstance(params.get("input"), str | list):
        raise ValidationError(
            "responses_create_params.input: required, a string or a list of input items",
            field="responses_create_params.input",
        )
    return body


def row_instruction(row: Mapping[str, Any]) -> str:
    """The text of the row's last user message (``input`` itself when it is a string; ``input_text`` parts
    joined)."""
    given = row["responses_create_params"]["input"]
    if isinstance(given, str):
        return given
    for item in reversed(given):
        if isinstance(item, Mapping) and item.get("role") == "user":
            return _text(item.get("content"))
    raise ValidationError("responses_create_params.input: no user message to take the instruction from",
                          field="responses_create_params.input")  # fmt: skip


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [part.get("text") for part in content if isinstance(part, Mapping)]
        return "\n".join(part for part in parts if isinstance(part, str))
    return ""


def row_where(row: Mapping[str, Any]) -> str:
    """How errors name the row: its task and rollout indices, when it has them."""
    marks = [f"{key}={row[key]}" for key in ("_ng_task_index", "_ng_rollout_index", "_rowidx") if key in row]
    return f"row ({', '.join(marks)})" if marks else "row"


def row_task(template: jinja2.Template, row: dict[str, Any]) -> dict[str, Any]:
    """The task ``template`` renders for ``row``; ``task_id`` defaults to ``gym-<_ng_task_index>``."""
    index = row.get("_ng_task_index", row.get("_rowidx", 0))
    task = render_task(template, Row(row, row_where(row)), index if isinstance(index, int) else 0,
                       {"instruction": row_instruction(row)})  # fmt: skip
    task.setdefault("task_id", f"gym-{index}")
    task["num_samples"] = 1  # NeMo RL sends each rollout of a group as a row of its own
    metadata = task.get("metadata") if isinstance(task.get("metadata"), dict) else {}
    task["metadata"] = {**metadata, "nemo_gym": {k: row[k] for k in row if k.startswith("_ng_") or k == "_rowidx"}}
    return task


def checked_task(template: jinja2.Template, row: dict[str, Any]) -> dict[str, Any]:
    """``row_task``, validated on its own (so one bad row is refused alone); ValidationError naming the row. That
    includes what JSON carries but Postgres cannot store (a NUL character, common in SWE tool outputs): left to the
    group's insert, it would fail every row submitted with it."""
    task = row_task(template, row)
    try:
        check_storable(task)
        parse_batch_request({"name": BATCH_NAME, "tasks": [task]})
    except ValidationError as exc:
        raise ValidationError(f"{row_where(row)}: {exc}", field=exc.field) from exc
    return task


def rows_batch(tasks: list[dict[str, Any]]) -> BatchRequest:
    """One batch of checked tasks: the session of ``tasks[i]`` has ``task_position`` i."""
    return parse_batch_request({"name": BATCH_NAME, "tasks": tasks})
