"""The bounds of a copy step (``{"copy": src, "to": dst}`` in ``runtime.prepare``): where it may read, where it may
write.

- **Source**: an absolute host path whose real path (links and ``..`` resolved) is under one of the operator's
  ``POLAR_COPY_ROOTS`` (``Config.copy_roots``, themselves resolved). None configured: copy steps are refused. A
  submission is checked by the API (a 400 naming ``tasks[i].runtime.prepare[j].copy``), and the worker checks
  again at copy time, since the API and the worker may be different hosts and a root may change meanwhile.
- **Destination**: relative to the session's work directory without ``..`` (``CopyStep`` refuses anything else at
  submission); at copy time no link on the way is followed (``polar.runtimes.session_files``), so a link an
  earlier prepare step planted cannot redirect it. For a Docker runtime with a ``workdir`` the destination is
  still under the session's ``work/``, which the container sees at the same path, never the image's own
  directories.

What is copied: a file, or a directory's content; links inside are copied as links, never read through.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import pydantic

from polar.contract.task_request import CopyStep, RuntimeSpec, TaskRequest
from polar.errors import ValidationError

HOW_TO_ALLOW = "set POLAR_COPY_ROOTS to the host directories copy steps may read"


def copy_source(source: str, roots: Sequence[str]) -> Path:
    """The real path of a copy step's ``source``, when it is under one of ``roots``; ValidationError saying why
    not (no roots configured, a relative path, outside every root once links are resolved)."""
    if not roots:
        raise ValidationError(f"copy steps are refused here: no POLAR_COPY_ROOTS is configured; {HOW_TO_ALLOW}")
    if not os.path.isabs(source):
        raise ValidationError(f"{source!r} must be an absolute path under POLAR_COPY_ROOTS")
    real = Path(os.path.realpath(source))
    if not any(real.is_relative_to(os.path.realpath(root)) for root in roots):
        shown = f"{source!r}" if str(real) == source else f"{source!r} (really {str(real)!r})"
        raise ValidationError(f"{shown} is not under POLAR_COPY_ROOTS ({', '.join(roots)})")
    return real


def check_task_copies(task: TaskRequest, roots: Sequence[str], field: str) -> None:
    """Refuse a task (at ``field``, e.g. ``tasks[0]``) with a copy step reading outside ``roots``: in its runtime,
    or in the clean runtime its evaluator's config describes (``evaluator.config.runtime``)."""
    check_copy_steps(task.runtime, roots, f"{field}.runtime")
    raw = task.evaluator.config.get("runtime")
    if isinstance(raw, Mapping):
        try:
            spec = RuntimeSpec.model_validate(raw)
        except pydantic.ValidationError:
            return  # not a runtime spec: the evaluator's own check says what is wrong with it
        check_copy_steps(spec, roots, f"{field}.evaluator.config.runtime")


def check_copy_steps(spec: RuntimeSpec, roots: Sequence[str], field: str) -> None:
    """Refuse a runtime spec (at ``field``, e.g. ``tasks[0].runtime``) whose copy steps read outside ``roots``."""
    for index, step in enumerate(spec.prepare):
        if isinstance(step, CopyStep):
            where = f"{field}.prepare[{index}].copy"
            try:
                copy_source(step.copy_, roots)
            except ValidationError as exc:
                raise ValidationError(f"{where}: {exc.message}", field=where) from None
