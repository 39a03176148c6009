"""``reward_file``: the reward is what the task's own verifier writes to a file (Harbor's convention).

The optional ``command`` (the verifier) runs first in the judging runtime (the session's, or with ``fresh_runtime``
a clean one into which the harness's work is collected) with ``POLAR_REWARD_DIR`` set to the session's
``logs/verifier`` directory, made for it beforehand; in Docker that directory is also ``/logs/verifier``. Its exit
code is recorded but is not the reward; a verifier that runs out of time was hung by the work (``EvaluationError``:
the task's ``failure_reward``). Before it runs, any reward file at the places read below is removed, so a harness
cannot leave a reward behind for its own verifier.

The reward is then read from the first of these files that exists, or from ``path`` alone when given (relative:
under the work directory; ``/logs/...``: under the session's logs directory):

    <session dir>/logs/verifier/reward.txt, <session dir>/logs/verifier/reward.json,
    <work dir>/reward.txt, <work dir>/reward.json

A ``.json`` file holds a number, or an object whose ``key`` entry (default ``reward``) is the reward, or else its
only numeric value; any other file holds one number as text. No file (the work deleted it, or the verifier never
wrote it), a link or FIFO planted there, or content that is no such number, is the work's failure
(``EvaluationError``, ``UnsafePath``): the session ends failed with its task's ``failure_reward``, its trajectories
kept.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import Field, field_validator, model_validator

from polar.errors import EvaluationError
from polar.evaluators.base import Evaluation, EvaluationContext
from polar.evaluators.commands import (
    CommandConfig,
    command_details,
    prepare_judging,
    refuse_idle_fresh_options,
    run_command,
)
from polar.runtimes.base import Runtime
from polar.runtimes.session_files import chown_dir, exists, make_dirs, owner, read_output, remove_file
from polar.task_request import RuntimeSpec, TaskRequest

LOG_NAME = "verifier"
REWARD_DIR = "logs/verifier"  # under the session directory
REWARD_DIR_ENV = "POLAR_REWARD_DIR"
DEFAULT_FILES = (f"{REWARD_DIR}/reward.txt", f"{REWARD_DIR}/reward.json", "work/reward.txt", "work/reward.json")
LOGS_PREFIX = PurePosixPath("/logs")


class RewardFileConfig(CommandConfig):
    # The one file to read (default: the search above); relative to the work directory, or under /logs/.
    path: str | None = Field(default=None, min_length=1)
    # The entry of a reward.json object that holds the reward.
    key: str = Field(default="reward", min_length=1)

    @field_validator("path")
    @classmethod
    def _inside_the_session(cls, path: str | None) -> str | None:
        if path is not None:
            _session_relative(path)
        return path

    @model_validator(mode="after")
    def _no_idle_options(self) -> RewardFileConfig:
        refuse_idle_fresh_options(self)
        return self


def _session_relative(path: str) -> str:
    """``path`` as the config gives it → the same file relative to the session directory."""
    pure = PurePosixPath(path)
    if pure.is_absolute():
        if not pure.is_relative_to(LOGS_PREFIX) or pure == LOGS_PREFIX:
            raise ValueError("an absolute path must be under /logs/ (the session's logs); others are relative")
        parts = ("logs", *pure.relative_to(LOGS_PREFIX).parts)
    else:
        parts = ("work", *pure.parts)
    if ".." in parts:
        raise ValueError("must not leave the session's directory ('..')")
    return "/".join(parts)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


# A reward file holds a number or a small JSON object; anything bigger is read from its end only.
REWARD_FILE_LIMIT = 1024 * 1024


def read_reward(session_dir: Path, name: str, key: str) -> tuple[float, dict[str, float] | None]:
    """The reward in the file ``name`` under ``session_dir``, with every numeric entry of a JSON object. The
    harness may have made it: a link or a FIFO there is refused (UnsafePath), never read."""
    try:
        text = read_output(session_dir, name, limit=REWARD_FILE_LIMIT)
    except OSError as exc:
        raise EvaluationError(f"cannot read the reward file {name}: {exc}") from exc
    shown = name
    if PurePosixPath(name).suffix != ".json":
        try:
            value = float(text.strip())
        except ValueError:
            raise EvaluationError(f"reward file {shown} holds {text[:200]!r}, not a number") from None
        if not math.isfinite(value):
            raise EvaluationError(f"reward file {shown} holds {value}, not a finite number")
        return value, None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise EvaluationError(f"reward file {shown} is not JSON: {exc}") from exc
    if _is_number(data):
        return float(data), None
    if not isinstance(data, dict):
        raise EvaluationError(f"reward file {shown} holds a JSON {type(data).__name__}, not a number or an object")
    numbers = {name: float(value) for name, value in data.items() if _is_number(value)}
    if key in data:
        if not _is_number(data[key]):
            raise EvaluationError(f"reward file {shown}: {key!r} is {data[key]!r}, not a number")
        return float(data[key]), numbers
    if len(numbers) == 1:
        return next(iter(numbers.values())), numbers
    raise EvaluationError(
        f"reward file {shown} has no {key!r} entry and {len(numbers)} numeric entries "
        f"({', '.join(numbers) or 'none'}): set 'key' to the one that is the reward"
    )


def make_reward_dir(session_dir: Path) -> Path:
    """The verifier's reward directory, made now and owned like ``logs/`` (in Docker, by the container's user).
    The harness owns ``logs/``: a link there (or at ``logs/verifier``) is refused, never made into or chowned."""
    try:
        directory = make_dirs(session_dir, REWARD_DIR)
        uid, gid = owner(session_dir, "logs")
    except OSError as exc:  # the harness made logs/ or logs/verifier a file: its doing
        raise EvaluationError(f"cannot make the reward directory {REWARD_DIR}: {exc}") from exc
    with contextlib.suppress(PermissionError):  # only a root worker may hand it over; otherwise it is ours already
        chown_dir(session_dir, REWARD_DIR, uid, gid)
    return directory


class RewardFile:
    def __init__(self, config: Mapping[str, Any]) -> None:
        self.config = RewardFileConfig.model_validate(config)
        self._files = (_session_relative(self.config.path),) if self.config.path else DEFAULT_FILES

    def fresh_runtime(self, task: TaskRequest) -> RuntimeSpec | None:
        return self.config.fresh_runtime_spec(task)

    def evaluate(self, context: EvaluationContext) -> Evaluation:
        runtime, collected = prepare_judging(context, self.config)
        details: dict[str, Any] = {}
        if collected is not None:
            details["collected"] = collected
        if self.config.command is not None:
            details["verifier"] = self._verify(context, runtime, self.config.command)
        found = next((name for name in self._files if exists(runtime.session_dir, name, directories=False)), None)
        if found is None:
            verifier = details.get("verifier")
            ran = f"; the verifier exited with code {verifier['exit_code']}" if verifier else ""
            tail = f", its output ends: {verifier['output_tail'][-500:]!r}" if verifier else ""
            raise EvaluationError(f"no reward file: looked for {', '.join(self._files)}{ran}{tail}", details)
        try:
            reward, numbers = read_reward(runtime.session_dir, found, self.config.key)
        except EvaluationError as exc:
            raise EvaluationError(str(exc), {**details, "file": found}) from exc
        details["file"] = found
        if numbers is not None:
            details["rewards"] = numbers
        return Evaluation(reward=reward, details=details)

    def _verify(self, context: EvaluationContext, runtime: Runtime, command: str) -> dict[str, Any]:
        reward_dir = make_reward_dir(runtime.session_dir)
        for name in self._files:
            remove_file(runtime.session_dir, name)
        result, output = run_command(
            runtime, context.task, command, self.config.timeout_seconds, LOG_NAME, {REWARD_DIR_ENV: str(reward_dir)}
        )
        details = command_details(result, output)
        if result.timed_out:
            raise EvaluationError(
                f"the verifier ran out of its {self.config.timeout_seconds:g}s; its output ends: {output[-500:]!r}",
                {"verifier": details},
            )
        return details
