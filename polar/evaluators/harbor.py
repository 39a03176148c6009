"""``harbor``: a Harbor task's verifier (``tests/test.sh``) scores the session, and its reward is read as Harbor
reads it.

    {"name": "harbor", "config": {"tests": [<bundle of tests/>], "timeout_seconds": 600, "env": {...}}}

The loader (``polar.loaders.harbor``) fills the config from a task folder; the files travel in the request
(``polar.harbor.bundle``). After the harness has ended (its processes killed), in the session's runtime, as
Harbor's default ("shared") verifier mode does:

1. any ``reward.json``/``reward.txt`` under ``logs/verifier`` (``/logs/verifier`` in Docker) is removed, so a
   reward the harness left there is never read;
2. the tests are written to a folder of the session directory the harness could not guess, then copied to
   ``/tests`` when the image has it (Polar's Harbor images do, ``polar.harbor.images``), replacing whatever the
   harness put there;
3. ``bash /tests/test.sh`` runs in the task's working directory with ``[verifier] env`` under its own time limit;
4. the reward is ``reward.json`` when it exists (a number, or an object's ``reward`` entry, or its only number),
   else ``reward.txt`` (one number); neither is an error, as in Harbor.
"""

from __future__ import annotations

import shlex
import uuid
from collections.abc import Mapping
from typing import Any

from pydantic import Field, model_validator

from polar.errors import EvaluationError
from polar.evaluators.base import Evaluation, EvaluationContext, EvaluatorConfig
from polar.evaluators.commands import DEFAULT_TIMEOUT_S, command_details, judging_runtime, run_command
from polar.evaluators.reward_file import REWARD_DIR, REWARD_DIR_ENV, make_reward_dir, read_reward
from polar.harbor.bundle import BundleFile, run_from_mount, unpack
from polar.runtimes.session_files import exists, remove_file

LOG_NAME = "verifier"
# Harbor reads the JSON first.
REWARD_FILES = (f"{REWARD_DIR}/reward.json", f"{REWARD_DIR}/reward.txt")
_RUN_TESTS = run_from_mount("/tests", "test.sh")


class HarborConfig(EvaluatorConfig):
    tests: list[BundleFile] = Field(min_length=1)
    timeout_seconds: float = Field(default=DEFAULT_TIMEOUT_S, gt=0)
    env: dict[str, str] = Field(default_factory=dict)

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
        tests = unpack(root, f"harbor/tests-{uuid.uuid4().hex}", self.config.tests)
        command = f"/bin/sh -c {shlex.quote(_RUN_TESTS)} sh {shlex.quote(str(tests))}"
        env = {**self.config.env, REWARD_DIR_ENV: str(reward_dir)}
        result, output = run_command(runtime, context.task, command, self.config.timeout_seconds, LOG_NAME, env)
        details: dict[str, Any] = {"verifier": command_details(result, output)}
        if result.timed_out:
            raise EvaluationError(
                f"the verifier ran out of its {self.config.timeout_seconds:g}s; its output ends: {output[-500:]!r}"
            )
        found = next((name for name in REWARD_FILES if exists(root, name, directories=False)), None)
        if found is None:
            raise EvaluationError(
                f"no reward file: tests/test.sh (exit code {result.exit_code}) wrote neither /logs/verifier/"
                f"reward.json nor reward.txt; its output ends: {output[-500:]!r}"
            )
        reward, numbers = read_reward(root, found, "reward")
        details["file"] = found
        if numbers is not None:
            details["rewards"] = numbers
        return Evaluation(reward=reward, details=details)
