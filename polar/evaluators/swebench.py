"""``swebench``: grade a session on a SWE-bench / SWE-Gym instance the way SWE-bench's own harness does.

    evaluator = {"name": "swebench", "config": {"instance": ROW, "repo_dir": "/testbed", "test_cmd": None,
                 "log_parser": None, "timeout_seconds": 1800, "runtime": None,
                 "max_patch_bytes": 16777216, "revert_test_config": true}}

ROW is the dataset row: ``instance_id``, ``repo``, ``base_commit``, ``test_patch``, ``FAIL_TO_PASS`` and
``PASS_TO_PASS`` (lists, or the JSON strings the HF datasets hold) are required; other keys are kept. The task's
runtime must hold the repository at ``repo_dir`` (relative: under the work directory) checked out at
``base_commit`` (prepare steps, or an instance image); the clean runtime is prepared the same way, or from
``runtime`` when given.

1. In the session's runtime, everything the harness changed under ``repo_dir`` since ``base_commit`` becomes the
   model patch (new untracked files included, ignored ones not), at most ``max_patch_bytes`` (default 16 MiB):
   the new and changed files are measured before git copies them anywhere, and the diff is written through a
   bound, so a multi-GB file the harness left fills neither memory nor disk. Over the limit is the work's failure.
2. Files of the patch that configure how the tests run (``conftest.py``, pytest / tox configuration,
   ``sitecustomize.py``, ``.pth`` files: ``polar.evaluators.swebench_patch``) are named in the details
   (``test_config_files``) and, with ``revert_test_config`` (default true), dropped from the patch
   (``test_config_reverted``), so the repository's own test configuration judges the fix.
3. In the clean runtime the patch is applied with swebench's fallbacks (``git apply``, ``--3way``, ``--reject``,
   ``patch --fuzz=5``). An empty patch applies nothing, but the tests still run on the untouched base, so the
   report shows what fails before any fix. A patch that applies by no means is not tested.
4. An eval script in SWE-bench's shape runs: the test files ``test_patch`` touches reset to ``base_commit``,
   ``test_patch`` applied, ``test_cmd`` (default ``pytest -rA``) on those files between swebench's output markers,
   its exit code recorded. Without a ``test_cmd``, a SWE-bench 5 row's own ``eval_script`` runs instead.
5. swebench grades the log (``get_logs_eval``, ``get_eval_tests_report``, ``get_resolution_status``). Reward 1.0
   iff the patch applied and the status is ``RESOLVED_FULL``; the report is the evaluation's details, which the
   ``swebench_reports`` view reads.

What the work can cause is the work's failure (``EvaluationError``: the session scores its task's
``failure_reward``, its trajectories and the report kept): a diff that cannot be taken in the session's runtime (the
harness broke or removed its repository), a patch over ``max_patch_bytes``, or an apply or test step past
``timeout_seconds``. A clean runtime
without the repository is the machinery's (the attempt is ``unscorable`` and retried); a harness that broke the code
only loses the reward.
"""

from __future__ import annotations

import importlib
import json
import shlex
import tempfile
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from polar.contract.task_request import RuntimeSpec, TaskRequest
from polar.errors import EvaluationError
from polar.evaluators.base import Evaluation, EvaluationContext, EvaluatorConfig
from polar.evaluators.commands import judging_runtime, run_command
from polar.evaluators.swebench_patch import screen
from polar.runtimes.base import Runtime
from polar.runtimes.session_files import FileTooLarge, read_bytes, read_output

DEFAULT_REPO_DIR = "/testbed"  # where SWE-bench's instance images hold the repository
DEFAULT_TIMEOUT_S = 1800.0
INSTALL_HINT = "the swebench evaluator needs the swebench package: pip install 'polar[swebench]'"
FOLDER = "swebench"  # under each runtime's session directory: the patches and scripts
MAX_STORED_PATCH_CHARS = 1_000_000
DEFAULT_MAX_PATCH_BYTES = 16 * 1024 * 1024
LOG_TAIL_CHARS = 4000


def _script() -> ModuleType:
    """``polar.evaluators.swebench_script``, which imports the swebench package (loaded on first use)."""
    try:
        return importlib.import_module("polar.evaluators.swebench_script")
    except ImportError as exc:
        raise ValueError(f"{INSTALL_HINT} ({exc})") from exc


def _known_parser(name: str | None) -> str | None:
    if name is not None and not _script().known_parser(name):
        raise ValueError(f"{name!r} is not a log parser of swebench's PARSER_REGISTRY (e.g. 'parse_log_pytest')")
    return name


class SWEBenchInstance(BaseModel):
    """The row's keys grading uses (``patch``, the gold fix, is not needed); the rest are kept as given."""

    model_config = ConfigDict(extra="allow", frozen=True)

    instance_id: str = Field(min_length=1)
    repo: str = Field(min_length=1)
    base_commit: str = Field(min_length=1)
    test_patch: str
    FAIL_TO_PASS: list[str] = Field(min_length=1)
    PASS_TO_PASS: list[str]
    version: str = ""
    log_parser: str | None = None
    eval_type: Literal["pass_and_fail", "fail_only"] | None = None
    eval_script: str | None = None

    @field_validator("FAIL_TO_PASS", "PASS_TO_PASS", mode="before")
    @classmethod
    def _json_list(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                return json.loads(value)
            except ValueError as exc:
                raise ValueError(f"not a JSON list of test names: {exc}") from exc
        return value

    @field_validator("version", mode="before")
    @classmethod
    def _text(cls, value: Any) -> Any:
        return str(value) if isinstance(value, int | float) else value

    @field_validator("test_patch")
    @classmethod
    def _a_git_diff(cls, value: str) -> str:
        if "diff --git a/" not in value:
            raise ValueError("not a git diff (no 'diff --git' header)")
        return value

    @field_validator("log_parser")
    @classmethod
    def _parser(cls, value: str | None) -> str | None:
        return _known_parser(value)


class SWEBenchConfig(EvaluatorConfig):
    instance: SWEBenchInstance
    repo_dir: str = Field(default=DEFAULT_REPO_DIR, min_length=1)
    test_cmd: str | None = Field(default=None, min_length=1)
    log_parser: str | None = None
    timeout_seconds: float = Field(default=DEFAULT_TIMEOUT_S, gt=0)
    runtime: RuntimeSpec | None = None
    # The largest model patch judged (and the most its new and changed files may hold); over it: the work's failure.
    max_patch_bytes: int = Field(default=DEFAULT_MAX_PATCH_BYTES, gt=0)
    # Drop the patch's conftest.py, pytest / tox configuration, sitecustomize.py and .pth files before applying it.
    revert_test_config: bool = True

    @field_validator("log_parser")
    @classmethod
    def _parser(cls, value: str | None) -> str | None:
        return _known_parser(value)


class SWEBench:
    def __init__(self, config: Mapping[str, Any]) -> None:
        _script()  # the package first: without it, every config would look wrong
        self.config = SWEBenchConfig.model_validate(config)

    def fresh_runtime(self, task: TaskRequest) -> RuntimeSpec:
        """Always a clean runtime: the harness may have edited the tests or the environment."""
        return self.config.runtime or task.runtime

    def evaluate(self, context: EvaluationContext) -> Evaluation:
        script, config = _script(), self.config
        session, clean = judging_runtime(context, fresh=False), judging_runtime(context, fresh=True)
        patch, pyproject_diff = self._model_patch(session, context.task)
        screened = screen(patch, pyproject_diff, config.revert_test_config)
        folder = clean.session_dir / FOLDER
        lines = script.eval_lines(config.instance, config.repo_dir, config.test_cmd, folder / "test.patch")
        spec = script.spec_for(config.instance, config.log_parser, lines)
        files = {
            "model.patch": screened.patch,
            "test.patch": config.instance.test_patch.encode(),
            "apply.sh": script.apply_script(config.repo_dir, folder / "model.patch").encode(),
            "eval.sh": spec.eval_script.encode(),
        }
        _copy_files(clean, folder, files)
        empty = not patch.strip()
        nothing = not screened.patch.strip()  # empty, or only test configuration that was reverted
        applied, apply_output = (False, "") if nothing else self._apply(clean, context.task, folder)
        output: str | None = None  # the eval script's output, when it ran
        timed_out = False
        if applied or nothing:
            command = f"bash {shlex.quote(str(folder / 'eval.sh'))}"
            result, output = run_command(clean, context.task, command, config.timeout_seconds, "swebench-eval")
            timed_out = result.timed_out
        report = script.grade(spec, output, applied)
        own_script = config.test_cmd is not None or config.instance.eval_script is None
        text = patch.decode("utf-8", errors="replace")
        details = {
            "instance_id": config.instance.instance_id,
            **report,
            "patch_is_empty": empty,
            "patch_applied": applied,
            # Known for our own eval script only: a row's eval_script carries on when its test patch fails.
            "test_patch_applied": script.reached_tests(output) if output is not None and own_script else None,
            "tests_timed_out": timed_out,
            "model_patch": text[:MAX_STORED_PATCH_CHARS],
            "model_patch_truncated": len(text) > MAX_STORED_PATCH_CHARS,
            "test_config_files": screened.flagged,
            "test_config_reverted": screened.reverted,
            "log_tail": (output or apply_output)[-LOG_TAIL_CHARS:],
        }
        if timed_out:
            raise EvaluationError(f"the tests ran out of their {config.timeout_seconds:g}s", details)
        return Evaluation(reward=1.0 if report["resolved"] else 0.0, details=details)

    def _model_patch(self, runtime: Runtime, task: TaskRequest) -> tuple[bytes, bytes | None]:
        """The harness's changes since base_commit, as bytes (a diff need not be UTF-8), and the whole-file diff of
        its ``pyproject.toml`` files (None when it cannot be read)."""
        script, limit = _script(), self.config.max_patch_bytes
        folder = runtime.session_dir / FOLDER
        command = script.diff_script(self.config.repo_dir, self.config.instance.base_commit, folder, limit)
        result, output = run_command(runtime, task, command, self.config.timeout_seconds, "swebench-diff")
        if result.exit_code == script.OVER_LIMIT_EXIT:
            raise EvaluationError(
                f"the model patch is over max_patch_bytes ({limit}): {_small(runtime, folder / 'over').strip()}",
                {
                    "instance_id": self.config.instance.instance_id,
                    "patch_too_large": True,
                    "max_patch_bytes": limit,
                    "largest_changes": _small(runtime, folder / "changed.sizes").splitlines()[-10:],
                },
            )
        if result.exit_code != 0:
            status = "timed out" if result.timed_out else f"exited with code {result.exit_code}"
            raise EvaluationError(
                f"cannot take the harness's diff in {self.config.repo_dir!r} ({status}): {output[-500:]}"
            )
        # Written inside the runtime, read on the host: the harness may have made the folder a link (UnsafePath).
        try:
            patch = read_bytes(runtime.session_dir, folder / "model.patch", limit=limit)
        except FileTooLarge as exc:
            raise EvaluationError(
                f"the model patch is over max_patch_bytes ({limit}): {exc.size} bytes",
                {"instance_id": self.config.instance.instance_id, "patch_too_large": True, "max_patch_bytes": limit},
            ) from exc
        try:
            pyproject = read_bytes(runtime.session_dir, folder / "pyproject.diff", limit=limit)
        except OSError:  # over the limit (or missing): every pyproject.toml of the patch counts as configuration
            pyproject = None
        return patch, pyproject

    def _apply(self, runtime: Runtime, task: TaskRequest, folder: Path) -> tuple[bool, str]:
        """Whether the model patch applied in the clean runtime, and what applying printed."""
        command = f"bash {shlex.quote(str(folder / 'apply.sh'))}"
        result, output = run_command(runtime, task, command, self.config.timeout_seconds, "swebench-apply")
        if result.timed_out:  # the patch the work made is what took so long
            raise EvaluationError(f"applying the patch in the clean runtime timed out in {self.config.repo_dir!r}")
        if result.exit_code == _script().NO_REPOSITORY_EXIT:
            raise RuntimeError(f"the clean runtime has no git repository in {self.config.repo_dir!r}: {output}")
        return result.exit_code == 0, output


def _copy_files(runtime: Runtime, folder: Path, files: Mapping[str, bytes]) -> None:
    """Put ``files`` in ``folder`` of ``runtime`` (through ``copy_in``: a container may own the path)."""
    with tempfile.TemporaryDirectory() as staging:
        staged = Path(staging) / folder.name
        staged.mkdir()
        for name, content in files.items():
            (staged / name).write_bytes(content)
        runtime.copy_in(staged, str(folder))


def _small(runtime: Runtime, path: Path) -> str:
    """The end of a small file the diff script wrote (empty when it cannot be read)."""
    try:
        return read_output(runtime.session_dir, path, limit=4096)
    except OSError:
        return ""
