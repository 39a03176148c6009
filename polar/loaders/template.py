"""Tasks from any JSONL plus a template: the template is a TaskRequest written as JSON with Jinja2 in it, rendered
once per row and parsed as JSON.

    {"task_id": {{ id | tojson }}, "instruction": {{ ("What is " ~ expression ~ "?") | tojson }},
     "harness": {"name": "python", "command": "polar.agents.calculator:run"},
     "evaluator": {"name": "test_on_output", "config": {"answer": {"expected": {{ answer | tojson }}}}}}

Variables: each field of the row by name, ``row`` (the whole row, for keys that are not identifiers) and ``index``
(the row's position, from 0). Undefined names are errors rather than empty strings (``StrictUndefined``), and
``tojson`` embeds any value, strings included, as valid JSON. Templates render in Jinja's sandbox.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import jinja2
from jinja2.sandbox import SandboxedEnvironment

from polar.errors import ValidationError
from polar.loaders.rows import Row, numbered

_HINT = "embed row values with the tojson filter, e.g. {{ field | tojson }}"


def compile_template(text: str, name: str = "template") -> jinja2.Template:
    """``text`` as a Jinja2 template with strict undefined names; a syntax error names ``name:line``."""
    environment = SandboxedEnvironment(undefined=jinja2.StrictUndefined, autoescape=False, keep_trailing_newline=True)
    try:
        return environment.from_string(text)
    except jinja2.TemplateSyntaxError as exc:
        raise ValidationError(f"{name}:{exc.lineno}: template syntax error: {exc.message}", field=name) from exc


def render(template: jinja2.Template, row: Row, index: int, extra: Mapping[str, Any] | None = None) -> str:
    """``template`` rendered for ``row`` (and ``extra`` variables); a failure (an undefined name, a bad filter
    argument) names the row."""
    variables = {**row.data, **(extra or {}), "row": row.data, "index": index}
    try:
        return template.render(variables)
    except jinja2.UndefinedError as exc:
        raise ValidationError(f"{row.where}: template: undefined variable: {exc.message}", field=row.where) from exc
    # Expressions in a template can fail like Python's ("a" + 1, x / 0, d["missing"]): still the row's fault.
    except (jinja2.TemplateError, TypeError, ValueError, ArithmeticError, LookupError) as exc:
        raise ValidationError(f"{row.where}: template: cannot render: {exc}", field=row.where) from exc


def render_task(
    template: jinja2.Template, row: Row, index: int, extra: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The task ``template`` renders for ``row``: a JSON object, not validated yet (``ValidationError`` naming the
    row when it is not JSON or not an object)."""
    text = render(template, row, index, extra)
    try:
        task = json.loads(text)
    except json.JSONDecodeError as exc:
        lines = text.splitlines() or [""]
        bad = lines[min(exc.lineno, len(lines)) - 1].strip()
        raise ValidationError(
            f"{row.where}: the rendered template is not valid JSON ({exc.msg} at rendered line {exc.lineno}, "
            f"column {exc.colno}: {bad[:160]!r}); {_HINT}",
            field=row.where,
        ) from exc
    if not isinstance(task, dict):
        raise ValidationError(
            f"{row.where}: the template must render a JSON object (a TaskRequest), got {type(task).__name__}",
            field=row.where,
        )
    return task


def tasks_from_template(
    rows: Iterable[Row | Mapping[str, Any]], template_text: str, template_name: str = "template"
) -> list[dict[str, Any]]:
    """One task dict per row: ``template_text`` rendered with the row's fields and parsed as JSON. The tasks are
    not validated here (``make_batch`` does that, after the batch defaults are merged in)."""
    template = compile_template(template_text, template_name)
    return [render_task(template, row, index) for index, row in enumerate(numbered(rows))]
