"""Tasks from any JSONL plus a template: the template is a TaskRequest written as JSON with Jinja2 in it, rendered
once per row and parsed as JSON.

    {"task_id": {{ id | tojson }}, "instruction": {{ ("What is " ~ expression ~ "?") | tojson }},
     "harness": {"name": "python", "command": "polar.agents.calculator:run"},
     "evaluator": {"name": "test_on_output", "config": {"answer": {"expected": {{ answer | tojson }}}}}}

Variables: each field of the row by name, ``row`` (the whole row, for keys that are not identifiers) and ``index``
(the row's position, from 0). Undefined names are errors rather than empty strings (``StrictUndefined``), and
``tojson`` embeds any value, strings included, as valid JSON. Templates render in Jinja's sandbox.

Where the rows come from someone else (``polar gym-agent``: a row posted by whoever may call it), compile with
``rows_fill_values_only``: whatever a ``{{ … }}`` prints that is not already JSON (``tojson``'s output) or a number
is escaped as the inside of a JSON string. A row value then fills the value the template prints it in and nothing
else: ``"instruction": "{{ instruction }}"`` with an instruction holding ``", "runtime": {…}`` stays one string,
never closes it to add or override a field (the last of two equal keys wins in JSON). So a row chooses a command,
an image or a runtime only where the template itself puts a row value there.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import jinja2
import markupsafe
from jinja2.sandbox import SandboxedEnvironment

from polar.errors import ValidationError
from polar.loaders.rows import Row, numbered

_HINT = "embed row values with the tojson filter, e.g. {{ field | tojson }}"


def _inside_a_string(value: Any) -> Any:
    """What a ``rows_fill_values_only`` template prints for ``value``: JSON text (``tojson`` returns it as Markup)
    and numbers as they are; anything else as the escaped inside of a JSON string, which cannot end that string."""
    if isinstance(value, markupsafe.Markup) or (isinstance(value, int | float) and not isinstance(value, bool)):
        return value
    return json.dumps(str(value))[1:-1]


def compile_template(text: str, name: str = "template", rows_fill_values_only: bool = False) -> jinja2.Template:
    """``text`` as a Jinja2 template with strict undefined names; a syntax error names ``name:line``. With
    ``rows_fill_values_only`` (rows from an untrusted caller), printed values cannot add JSON fields (module
    docstring)."""
    finalize = _inside_a_string if rows_fill_values_only else None
    environment = SandboxedEnvironment(undefined=jinja2.StrictUndefined, autoescape=False, keep_trailing_newline=True,
                                       finalize=finalize)  # fmt: skip
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
