"""``reward_file``: the reward is what the task's own verifier writes to a file (Harbor's convention).

The optional ``command`` (the verifier) runs first in the judging runtime (the session's, or with ``fresh_runtime``
a clean one into which the harness's work is collected), its reward directory, the session's ``logs/verifier``
(in Docker also ``/logs/verifier``), made for it beforehand and emptied of any reward file, so a harness cannot
leave a reward behind for its own verifier. The verifier's shell gets that directory as ``$POLAR_REWARD_DIR``, a
shell variable it does not export: the programs it starts (the tests that import the work's code) do not inherit
it; a script the verifier trusts gets it as an argument. Its exit code is recorded but is not the reward; a
verifier that runs out of time was hung by the work (``EvaluationError``: the task's ``failure_reward``).

The reward is then read from the one of these files that exists, or from ``path`` alone when given (relative:
under the work directory; ``/logs/...``: under the session's logs directory):

    with a command:  <session dir>/logs/verifier/reward.txt, <session dir>/logs/verifier/reward.json
    without one:     the same, then <work dir>/reward.txt, <work dir>/reward.json (the harness scores itself)

More than one of them is tampering (the work wrote a reward of its own beside the verifier's): the work's
failure, the files named. A ``.json`` file holds a number, or an object whose ``key`` entry (default ``reward``)
is the reward, or else its only numeric value; any other file holds one number as text. The reward must be a
finite number within ``reward_range`` (default [0, 1], the range of Harbor's rewards: 1.0 solved, a fraction for
partial credit). No file (the work deleted it, or the verifier never wrote it), a link or FIFO planted there, a file
over ``REWARD_FILE_LIMIT``, content the parser cannot take (nested past its stack, an integer past float range or
Python's digit limit, a key given twice) or that is no such number, is the work's failure (``EvaluationError``,
``UnsafePath``): the session ends failed with its task's ``failure_reward``, its trajectories kept.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import Field, field_validator, model_validator

from polar.contract.task_request import RuntimeSpec, TaskRequest
from polar.errors import EvaluationError
from polar.evaluators.base import Evaluation, EvaluationContext
from polar.evaluators.commands import (
    CommandConfig,
    command_details,
    prepare_judging,
    refuse_idle_fresh_options,
    run_command,
)
from polar.evaluators.reward_range import DEFAULT_RANGE, RewardRange, checked, finite
from polar.runtimes.base import Runtime
from polar.runtimes.session_files import FileTooLarge, chown_dir, exists, make_dirs, owner, read_bytes, remove_file

LOG_NAME = "verifier"
REWARD_DIR = "logs/verifier"  # under the session directory
REWARD_DIR_ENV = "POLAR_REWARD_DIR"
VERIFIER_FILES = (f"{REWARD_DIR}/reward.txt", f"{REWARD_DIR}/reward.json")
DEFAULT_FILES = (*VERIFIER_FILES, "work/reward.txt", "work/reward.json")
LOGS_PREFIX = PurePosixPath("/logs")
# A reward file holds a number or a small JSON object: a larger one is refused unread.
REWARD_FILE_LIMIT = 1024 * 1024


class RewardFileConfig(CommandConfig):
    # The one file to read (default: the search above); relative to the work directory, or under /logs/.
    path: str | None = Field(default=None, min_length=1)
    # The entry of a reward.json object that holds the reward.
    key: str = Field(default="reward", min_length=1)
    # [low, high]: a reward outside it is the work's failure.
    reward_range: RewardRange = DEFAULT_RANGE

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


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's entries; a key given twice is refused (which one counts would be the parser's choice)."""
    data: dict[str, Any] = {}
    for name, value in pairs:
        if name in data:
            raise ValueError(f"the key {name!r} is given twice")
        data[name] = value
    return data


def read_reward(session_dir: Path, name: str, key: str) -> tuple[float, dict[str, float] | None]:
    """The reward in the file ``name`` under ``session_dir``, with every finite numeric entry of a JSON object.
    The harness may have made it: a link or a FIFO there is refused (UnsafePath), never read; anything else its
    content makes go wrong (size, parsing, no number) is ``EvaluationError``."""
    try:
        text = read_bytes(session_dir, name, limit=REWARD_FILE_LIMIT).decode("utf-8", errors="replace")
    except FileTooLarge as exc:
        raise EvaluationError(f"reward file {name} holds {exc.size} bytes, over the limit of {exc.limit}") from exc
    except OSError as exc:
        raise EvaluationError(f"cannot read the reward file {name}: {exc}") from exc
    try:
        return _parse_reward(name, text, key)
    except EvaluationError:
        raise
    except Exception as exc:  # nested past the parser's stack, digits past Python's limit, ...: the work's content
        raise EvaluationError(f"reward file {name} cannot be read as a reward: {type(exc).__name__}: {exc}") from exc


def _parse_reward(shown: str, text: str, key: str) -> tuple[float, dict[str, float] | None]:
    if PurePosixPath(shown).suffix != ".json":
        try:
            value = float(text.strip())
        except ValueError:
            raise EvaluationError(f"reward file {shown} holds {text[:200]!r}, not a number") from None
        if finite(value) is None:
            raise EvaluationError(f"reward file {shown} holds {value}, not a finite number")
        return value, None
    try:
        data = json.loads(text, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as exc:
        raise EvaluationError(f"reward file {shown} is not JSON: {exc}") from exc
    if (number := finite(data)) is not None:
        return number, None
    if isinstance(data, int | float) and not isinstance(data, bool):
        raise EvaluationError(f"reward file {shown} holds {str(data)[:200]}, not a finite number")
    if not isinstance(data, dict):
        raise EvaluationError(f"reward file {shown} holds a JSON {type(data).__name__}, not a number or an object")
    numbers = {name: number for name, value in data.items() if (number := finite(value)) is not None}
    if key in data:
        if (number := finite(data[key])) is None:
            numeric = isinstance(data[key], int | float) and not isinstance(data[key], bool)
            kind = "a finite number" if numeric else "a number"
            raise EvaluationError(f"reward file {shown}: {key!r} is {str(data[key])[:200]!r}, not {kind}")
        return number, numbers
    if len(numbers) == 1:
        return next(iter(numbers.values())), numbers
    raise EvaluationError(
        f"reward file {shown} has no {key!r} entry and {len(numbers)} numeric entries "
        f"({', '.join(numbers) or 'none'}): set 'key' to the one that is the reward"
    )


def reward_files_present(session_dir: Path, names: tuple[str, ...]) -> list[str]:
    """Those of ``names`` that exist under ``session_dir`` (a directory there does not count)."""
    return [name for name in names if exists(session_dir, name, directories=False)]


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
        if self.config.path:
            self._files: tuple[str, ...] = (_session_relative(self.config.path),)
        else:  # a verifier's word is its own: what the work left in its directory is never read beside it
            self._files = VERIFIER_FILES if self.config.command is not None else DEFAULT_FILES

    def fresh_runtime(self, task: TaskRequest) -> RuntimeSpec | None:
        return self.config.fresh_runtime_spec(task)

    def evaluate(self, context: EvaluationContext) -> Evaluation:
        runtime, collected = prepare_judging(context, self.config)
        details: dict[str, Any] = {}
        if collected is not None:
            details["collected"] = collected
        if self.config.command is not None:
            details["verifier"] = self._verify(context, runtime, self.config.command)
        present = reward_files_present(runtime.session_dir, self._files)
        if not present:
            verifier = details.get("verifier")
            ran = f"; the verifier exited with code {verifier['exit_code']}" if verifier else ""
            tail = f", its output ends: {verifier['output_tail'][-500:]!r}" if verifier else ""
            raise EvaluationError(f"no reward file: looked for {', '.join(self._files)}{ran}{tail}", details)
        if len(present) > 1:
            raise EvaluationError(
                f"more than one reward file: {', '.join(present)} (a reward written beside the verifier's is "
                "tampering; a verifier writes one)",
                {**details, "files": present},
            )
        (found,) = present
        details["file"] = found
        try:
            reward, numbers = read_reward(runtime.session_dir, found, self.config.key)
            checked(reward, self.config.reward_range, f"the reward in {found}")
        except EvaluationError as exc:
            raise EvaluationError(str(exc), {**details, **exc.details}) from exc
        if numbers is not None:
            details["rewards"] = numbers
        return Evaluation(reward=reward, details=details)

    def _verify(self, context: EvaluationContext, runtime: Runtime, command: str) -> dict[str, Any]:
        reward_dir = make_reward_dir(runtime.session_dir)
        for name in self._files:
            remove_file(runtime.session_dir, name)
        result, output = run_command(
            runtime,
            context.task,
            command,
            self.config.timeout_seconds,
            LOG_NAME,
            shell_vars={REWARD_DIR_ENV: str(reward_dir)},
        )
        details = command_details(result, output)
        if result.timed_out:
            raise EvaluationError(
                f"the verifier ran out of its {self.config.timeout_seconds:g}s; its output ends: {output[-500:]!r}",
                {"verifier": details},
            )
        return details
