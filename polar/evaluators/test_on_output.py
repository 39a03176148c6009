"""``test_on_output``: judge a session by a command run after the harness, by a plain answer check, or by both.

reward = the command's score (when ``command`` is set) times the answer's score (when ``answer`` is set, 0 or 1).
The command runs with ``/bin/sh -c`` in the session's work directory, or with ``fresh_runtime`` in a clean runtime
prepared in init, into which the harness's work (``collect``) is copied first. Its score, by ``reward_from``:

- ``exit_code`` (default): 1.0 when it exits 0, else 0.0;
- ``number``: the last number it prints (stdout and stderr together), as is; it must be finite and within
  ``reward_range`` (default [0, 1]); printing none, or one that is not, is the work's failure;
- ``tests``: the statuses of the tests its pytest run reports, compared with ``expected_tests``; ``tests_score``
  ``all`` (1.0 when every expected test has its expected status, else 0.0) or ``fraction`` (the share that do).

Test statuses come from Polar's pytest plugin, loaded into the command's pytest, which writes them to a report
made after collection (``polar.evaluators.pytest_report``); lines the command prints decide nothing. The command
runs pytest once. No report, or a report the judged code could have forged (a second file, a test named twice), is
the work's failure; an expected test the report lacks (its module failed to collect) is a mismatch.

A command that runs out of its ``timeout_seconds`` was hung by the work, whatever ``reward_from``: like printing no
number, that is the work's failure (``EvaluationError``), and the session scores its task's ``failure_reward``.

STATUS is one of PASSED, FAILED, ERROR, SKIPPED, XFAIL, XPASS, each test's worst over its setup, call and
teardown (it passed, then its teardown errored: ERROR).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from polar.contract.task_request import RuntimeSpec, TaskRequest
from polar.errors import EvaluationError
from polar.evaluators import pytest_report
from polar.evaluators.answers import AnswerConfig, check_answer, last_number
from polar.evaluators.base import Evaluation, EvaluationContext
from polar.evaluators.commands import (
    CommandConfig,
    command_details,
    prepare_judging,
    refuse_idle_fresh_options,
    run_command,
)
from polar.evaluators.pytest_report import TestStatus
from polar.evaluators.reward_range import DEFAULT_RANGE, RewardRange, checked

LOG_NAME = "evaluator"


class TestOnOutputConfig(CommandConfig):
    __test__: ClassVar[bool] = False  # a config, not a pytest test class, whatever its name

    reward_from: Literal["exit_code", "number", "tests"] = "exit_code"
    # Test id (as pytest prints it) → the status it must have; required with reward_from "tests".
    expected_tests: dict[str, TestStatus] | None = Field(default=None, validate_default=True)
    tests_score: Literal["all", "fraction"] = "all"
    # [low, high] of reward_from "number": a number outside it is the work's failure.
    reward_range: RewardRange = DEFAULT_RANGE
    answer: AnswerConfig | None = None

    @field_validator("expected_tests")
    @classmethod
    def _tests_go_with_reward_from(
        cls, expected: dict[str, TestStatus] | None, info: ValidationInfo
    ) -> dict[str, TestStatus] | None:
        wants_tests = info.data.get("reward_from") == "tests"
        if wants_tests and not expected:
            raise ValueError("required (a non-empty mapping of test → status) when reward_from is 'tests'")
        if expected is not None and not wants_tests:
            raise ValueError("applies only to reward_from 'tests'")
        return expected

    @model_validator(mode="after")
    def _something_to_judge(self) -> TestOnOutputConfig:
        if self.command is None and self.answer is None:
            raise ValueError("needs a 'command', an 'answer', or both")
        if self.command is None:
            command_only = {"reward_from", "tests_score", "reward_range", "timeout_seconds", "fresh_runtime"}
            given = sorted(command_only & self.model_fields_set)
            if given:
                raise ValueError(f"{given[0]}: applies only with a 'command'")
        if self.reward_from != "tests" and "tests_score" in self.model_fields_set:
            raise ValueError("tests_score: applies only to reward_from 'tests'")
        if self.reward_from != "number" and "reward_range" in self.model_fields_set:
            raise ValueError("reward_range: applies only to reward_from 'number'")
        refuse_idle_fresh_options(self)
        return self


def score_tests(
    expected: Mapping[str, str], found: Mapping[str, str], how: Literal["all", "fraction"]
) -> tuple[float, dict[str, dict[str, str | None]]]:
    """The tests score and the expected tests that did not get their status (with what they got, None: absent)."""
    mismatched = {
        test: {"expected": status, "found": found.get(test)}
        for test, status in expected.items()
        if found.get(test) != status
    }
    if how == "fraction":
        return (len(expected) - len(mismatched)) / len(expected), mismatched
    return (0.0 if mismatched else 1.0), mismatched


class TestOnOutput:
    __test__: ClassVar[bool] = False  # an evaluator, not a pytest test class, whatever its name

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.config = TestOnOutputConfig.model_validate(config)

    def fresh_runtime(self, task: TaskRequest) -> RuntimeSpec | None:
        return self.config.fresh_runtime_spec(task)

    def evaluate(self, context: EvaluationContext) -> Evaluation:
        reward = 1.0
        details: dict[str, Any] = {}
        if self.config.command is not None:
            score, details["command"] = self._run_command(context, self.config.command)
            reward *= score
        if self.config.answer is not None:
            score, details["answer"] = check_answer(self.config.answer, context)
            reward *= score
        return Evaluation(reward=reward, details=details)

    def _run_command(self, context: EvaluationContext, command: str) -> tuple[float, dict[str, Any]]:
        config = self.config
        runtime, collected = prepare_judging(context, config)
        report: str | None = None
        env: dict[str, str] = {}
        if config.reward_from == "tests":
            report, env = pytest_report.prepare(runtime.session_dir, context.task.runtime.env)
        result, output = run_command(runtime, context.task, command, config.timeout_seconds, LOG_NAME, env)
        details = command_details(result, output)
        if collected is not None:
            details["collected"] = collected
        if result.timed_out:
            raise EvaluationError(
                f"the command ran out of its {config.timeout_seconds:g}s; its output ends: {output[-500:]!r}",
                {"command": details},
            )
        if config.reward_from == "number":
            number = last_number(output)
            if number is None:
                raise EvaluationError(
                    f"reward_from 'number': the command printed no number (it exited with code {result.exit_code}); "
                    f"its output ends: {output[-500:]!r}",
                    {"command": details},
                )
            details["number"] = number if math.isfinite(number) else str(number)  # JSON has no inf
            try:
                score = checked(number, config.reward_range, "reward_from 'number': the last number printed")
            except EvaluationError as exc:
                raise EvaluationError(f"{exc}; its output ends: {output[-500:]!r}", {"command": details}) from exc
        elif config.reward_from == "tests":
            assert config.expected_tests is not None and report is not None  # the config validator made sure
            try:
                details["tests"], errors = pytest_report.statuses(runtime.session_dir, report)
            except EvaluationError as exc:
                why = f"exited with code {result.exit_code}; its output ends: {output[-500:]!r}"
                raise EvaluationError(f"{exc} (the command {why})", {"command": {**details, **exc.details}}) from exc
            if errors:
                details["collection_errors"] = errors
            score, details["mismatched"] = score_tests(config.expected_tests, details["tests"], config.tests_score)
        else:
            score = 1.0 if result.exit_code == 0 else 0.0
        details["score"] = score
        return score, details
