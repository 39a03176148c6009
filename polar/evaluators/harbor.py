"""``harbor``: a Harbor task's verifier (``tests/test.sh``) scores the session, and its reward is read as Harbor
reads it.

    {"name": "harbor", "config": {"tests": [<bundle of tests/>], "timeout_seconds": 600, "env": {...},
                                  "reward_range": [0, 1]}}

The loader (``polar.loaders.harbor``) fills the config from a task folder; the files travel in the request
(``polar.harbor.bundle``). After the harness has ended (its processes killed), in the session's runtime, as
Harbor's default ("shared") verifier mode does:

1. any ``reward.json``/``reward.txt`` under ``logs/verifier`` (``/logs/verifier`` in Docker) is removed, so a
   reward the harness left there is never read;
2. the tests are written to a folder of the session directory the harness could not guess, then copied to
   ``/tests`` when the image has it (Polar's Harbor images do, ``polar.harbor.images``), replacing whatever the
   harness put there;
3. ``bash /tests/test.sh`` runs in the task's working directory with ``[verifier] env`` under its own time limit.
   The script itself has the reward directory as ``$POLAR_REWARD_DIR``, a variable bash sets from ``BASH_ENV``
   and does not export, so the programs it starts (the tests running the work's code) do not inherit it;
   Harbor's verifiers write the fixed ``/logs/verifier`` anyway;
4. the reward is ``reward.json`` when it exists (a number, or an object's ``reward`` entry, or its only number),
   else ``reward.txt`` (one number); neither is an error, as in Harbor. Harbor's verifiers often write both with
   the same reward, which is accepted; two that disagree are tampering (the work wrote one of them), the work's
   failure. The reward must be finite and within ``reward_range`` (default [0, 1]).
"""

from __future__ import annotations

import shlex
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from polar.errors import EvaluationError
from polar.evaluators.base import Evaluation, EvaluationContext, EvaluatorConfig
from polar.evaluators.commands import DEFAULT_TIMEOUT_S, command_details, judging_runtime, run_command
from polar.evaluators.reward_file import (
    REWARD_DIR,
    REWARD_DIR_ENV,
    make_reward_dir,
    read_reward,
    reward_files_present,
)
from polar.evaluators.reward_range import DEFAULT_RANGE, RewardRange, checked
from polar.harbor.bundle import BundleFile, run_from_mount, unpack
from polar.runtimes.session_files import remove_file, write_file

LOG_NAME = "verifier"
# Harbor reads the JSON first.
REWARD_FILES = (f"{REWARD_DIR}/reward.json", f"{REWARD_DIR}/reward.txt")
_RUN_TESTS = run_from_mount("/tests", "test.sh")


class HarborConfig(EvaluatorConfig):
    tests: list[BundleFile] = Field(min_length=1)
    timeout_seconds: float = Field(default=DEFAULT_TIMEOUT_S, gt=0)
    env: dict[str, str] = Field(default_factory=dict)
    reward_range: RewardRange = DEFAULT_RANGE

    @model_validator(mode="after")
    def _has_test_sh(self) -> HarborConfig:
        if not any(entry.path == "test.sh" for entry in self.tests):
            raise ValueError("tests: holds no test.sh")
        return self


class Harbor:
    def __init__(self, config: Mapping[str, Any]) -> None:
        self.config = HarborConfig.model_validate(config)

    def evaluate(self, context: EvaluationContext) -> Evaluation:
        runtime = judging_runtime(context, fresh=False)
        root = runtime.session_dir
        reward_dir = make_reward_dir(root)
        for name in REWARD_FILES:
            remove_file(root, name)
        hidden = f"harbor/tests-{uuid.uuid4().hex}"
        tests = unpack(root, hidden, self.config.tests)
        command = f"/bin/sh -c {shlex.quote(_RUN_TESTS)} sh {shlex.quote(str(tests))}"
        env = {**self.config.env, "BASH_ENV": str(self._reward_dir_for_bash(root, f"{hidden}.env", reward_dir))}
        result, output = run_command(runtime, context.task, command, self.config.timeout_seconds, LOG_NAME, env)
        details: dict[str, Any] = {"verifier": command_details(result, output)}
        if result.timed_out:
            raise EvaluationError(
                f"the verifier ran out of its {self.config.timeout_seconds:g}s; its output ends: {output[-500:]!r}"
            )
        present = reward_files_present(root, REWARD_FILES)
        if not present:
            raise EvaluationError(
                f"no reward file: tests/test.sh (exit code {result.exit_code}) wrote neither /logs/verifier/"
                f"reward.json nor reward.txt; its output ends: {output[-500:]!r}"
            )
        details["file"] = present[0]
        try:
            read = {name: read_reward(root, name, "reward") for name in present}
            reward, numbers = read[present[0]]
            if len({value for value, _ in read.values()}) > 1:
                found = ", ".join(f"{name} = {value:g}" for name, (value, _) in read.items())
                raise EvaluationError(
                    f"the reward files disagree: {found} (a reward written beside the verifier's is tampering)",
                    {"files": present},
                )
            checked(reward, self.config.reward_range, f"the reward in {present[0]}")
        except EvaluationError as exc:
            raise EvaluationError(str(exc), {**details, **exc.details}) from exc
        if len(present) > 1:
            details["files"] = present
        if numbers is not None:
            details["rewards"] = numbers
        return Evaluation(reward=reward, details=details)

    def _reward_dir_for_bash(self, root: Path, name: str, reward_dir: Path) -> Path:
        """The ``BASH_ENV`` file that gives ``bash test.sh`` the reward directory as a variable it does not export
        (and hands on the task's own ``BASH_ENV``, if it has one)."""
        lines = [f"{REWARD_DIR_ENV}={shlex.quote(str(reward_dir))}", "unset BASH_ENV"]
        if own := self.config.env.get("BASH_ENV"):
            lines.append(f'BASH_ENV={shlex.quote(own)}; export BASH_ENV; . "$BASH_ENV"')
        return write_file(root, name, "\n".join(lines) + "\n", mode=0o644)
