"""Running an evaluator's own commands: in the session's runtime after the harness, or in the clean runtime
prepared in init (``fresh_runtime``), with the environment prepare steps get and a time limit of their own.

The session's budget bounds the harness, not the judging: a session that timed out is still scored, so
evaluator commands run under their config's ``timeout_seconds``. A judging command that runs out of it was hung by
the work it judges (tests that never end): the evaluators raise ``EvaluationError``, and the session scores its
task's ``failure_reward``.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import Field

from polar.contract.task_request import RuntimeSpec, TaskRequest
from polar.errors import EvaluationError
from polar.evaluators.base import EvaluationContext, EvaluatorConfig
from polar.runtimes.base import ExecResult, Runtime, command_env
from polar.runtimes.session_files import exists, read_output, write_file

DEFAULT_TIMEOUT_S = 600.0
# How much of a command's output the stored details keep: the end, where test summaries and errors are.
DETAILS_TAIL_CHARS = 2000


class CommandConfig(EvaluatorConfig):
    """What every command-running evaluator accepts."""

    command: str | None = Field(default=None, min_length=1)
    timeout_seconds: float = Field(default=DEFAULT_TIMEOUT_S, gt=0)
    # Judge in a clean runtime prepared in init rather than in the one the harness used.
    fresh_runtime: bool = False
    # The clean runtime's spec (default: the task's own runtime, prepare steps and all).
    runtime: RuntimeSpec | None = None
    # Paths under the session's work directory copied into the clean runtime before judging (default: all of it).
    collect: list[str] | None = None

    def fresh_runtime_spec(self, task: TaskRequest) -> RuntimeSpec | None:
        if not self.fresh_runtime:
            return None
        return self.runtime or task.runtime


def refuse_idle_fresh_options(config: CommandConfig) -> None:
    """Raise ``ValueError`` when ``runtime`` or ``collect`` is given without ``fresh_runtime``: they would do
    nothing, and a config that silently does less than it says is worse than a 400."""
    if not config.fresh_runtime:
        given = sorted({"runtime", "collect"} & config.model_fields_set)
        if given:
            raise ValueError(f"{given[0]}: applies only with fresh_runtime true")


def judging_runtime(context: EvaluationContext, fresh: bool) -> Runtime:
    """Where to judge: the clean runtime when ``fresh`` (it must have been prepared), else the session's."""
    runtime = context.fresh_runtime if fresh else context.runtime
    if runtime is None:
        which = "the clean evaluator runtime" if fresh else "the session's runtime"
        raise RuntimeError(f"{which} is gone (the session ended before its runtime existed?)")
    return runtime


def collect_work(context: EvaluationContext, paths: Sequence[str] | None) -> list[str]:
    """Copy ``paths`` (relative to the session's work directory; None: everything in it) into the clean
    runtime's work directory. Returns what was copied; a path the harness never made is skipped. The harness
    owns what is copied: its links are copied as links, and one on the way to a path is refused (UnsafePath)."""
    source = judging_runtime(context, fresh=False)
    target = judging_runtime(context, fresh=True)
    root = source.session_dir
    work = root / "work"
    names = list(paths) if paths is not None else sorted(p.name for p in work.iterdir())
    copied = []
    for name in names:
        relative = PurePosixPath(name)
        if relative.is_absolute() or ".." in relative.parts:
            raise ValueError(f"collect: {name!r} is outside the session's work directory")
        if exists(root, work / relative):
            target.copy_in(work / relative, name, source_root=root)
            copied.append(name)
    return copied


def prepare_judging(context: EvaluationContext, config: CommandConfig) -> tuple[Runtime, list[str] | None]:
    """The runtime ``config`` judges in; a clean one first gets the session's work (``config.collect``).
    Returns it with what was collected (None when judging in the session's own runtime)."""
    runtime = judging_runtime(context, config.fresh_runtime)
    collected = collect_work(context, config.collect) if config.fresh_runtime else None
    return runtime, collected


def command_details(result: ExecResult, output: str) -> dict[str, Any]:
    """How a judging command ended, as stored in a session's evaluation details."""
    return {
        "exit_code": result.exit_code,
        "timed_out": result.timed_out,
        "duration_s": round(result.duration_s, 3),
        "output_tail": output[-DETAILS_TAIL_CHARS:],
    }


def run_command(
    runtime: Runtime,
    task: TaskRequest,
    command: str,
    timeout_s: float,
    log_name: str,
    extra_env: Mapping[str, str] | None = None,
    shell_vars: Mapping[str, str] | None = None,
) -> tuple[ExecResult, str]:
    """Run ``command`` with ``/bin/sh -c`` in ``runtime``'s work directory; returns how it ended and its output
    (read back from ``logs/<log_name>.log``, which is truncated first so a rerun starts clean; only its end when
    it is larger than ``READ_LIMIT_BYTES``). ``shell_vars`` are variables of that shell alone, set before the
    command and not exported (removed from the environment too): the programs it starts do not inherit them."""
    log = f"logs/{log_name}.log"
    try:  # never through a link the harness left there (UnsafePath)
        write_file(runtime.session_dir, log, b"")
    except OSError as exc:  # the harness left a directory there, or made logs/ a file: its doing
        raise EvaluationError(f"cannot write the judging log {log}: {exc}") from exc
    env = {**command_env(runtime.session_dir, task.runtime.env), **(extra_env or {})}
    assignments = ""
    for name, value in (shell_vars or {}).items():
        env.pop(name, None)
        assignments += f"{name}={shlex.quote(value)}\n"
    result = runtime.exec(["/bin/sh", "-c", assignments + command], env, timeout_s, log_name=log_name)
    return result, _read(runtime.session_dir, log)


def _read(root: Path, log: str) -> str:
    try:
        return read_output(root, log)
    except OSError:
        return ""
