"""``test_on_output``: judge a session by a command run after the harness, by a plain answer check, or by both.

reward = the command's score (when ``command`` is set) times the answer's score (when ``answer`` is set, 0 or 1).
The command runs with ``/bin/sh -c`` in the session's work directory, or with ``fresh_runtime`` in a clean runtime
prepared in init, into which the harness's work (``collect``) is copied first. Its score, by ``reward_from``:

- ``exit_code`` (default): 1.0 when it exits 0, else 0.0;
- ``number``: the last number it prints (stdout and stderr together), as is; printing none is the work's failure;
- ``tests``: the test statuses it prints, compared with ``expected_tests``; ``tests_score`` ``all`` (1.0 when
  every expected test has its expected status, else 0.0) or ``fraction`` (the share that do).

Test statuses are read from the two line shapes pytest prints, and no others, so nothing is guessed:

- ``STATUS <test>`` with an optional `` - <message>``: the short summary of ``pytest -rA`` (also with xdist's
  ``[gw0] [ 50%] `` in front);
- ``<test> STATUS`` with an optional `` (<reason>)`` and ``[ 50%]``: ``pytest -v``, where <test> holds ``::``.

A command that runs out of its ``timeout_seconds`` was hung by the work, whatever ``reward_from``: like printing no
number, that is the work's failure (``EvaluationError``), and the session scores its task's ``failure_reward``.

STATUS is one of PASSED, FAILED, ERROR, SKIPPED, XFAIL, XPASS. ``-rA`` names a skipped test by its location
rather than its id, so a SKIPPED expectation needs ``-v`` output. A test reported twice (it passed, then its
teardown errored) keeps the worse status.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from polar.errors import EvaluationError
from polar.evaluators.answers import AnswerConfig, check_answer, last_number
from polar.evaluators.base import Evaluation, EvaluationContext
from polar.evaluators.commands import (
    CommandConfig,
    command_details,
    prepare_judging,
    refuse_idle_fresh_options,
    run_command,
)
from polar.task_request import RuntimeSpec, TaskRequest

LOG_NAME = "evaluator"
TestStatus = Literal["PASSED", "SKIPPED", "XFAIL", "XPASS", "FAILED", "ERROR"]
# Better to worse: the order a test reported more than once is ranked by.
STATUS_RANK: dict[str, int] = {"PASSED": 0, "SKIPPED": 1, "XFAIL": 2, "XPASS": 3, "FAILED": 4, "ERROR": 5}

_STATUS = "|".join(STATUS_RANK)
_SUMMARY_LINE = re.compile(rf"^(?:\[gw\d+\] \[\s*\d+%\] )?({_STATUS}) (\S.*)$")
_VERBOSE_LINE = re.compile(rf"^(\S+::.*?) ({_STATUS})(?: \(.*\))?(?:\s+\[\s*\d+%\])?$")
_PARAMETRIZED_END = re.compile(r"\](?= - |$)")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


class TestOnOutputConfig(CommandConfig):
    __test__: ClassVar[bool] = False  # a config, not a pytest test class, whatever its name

    reward_from: Literal["exit_code", "number", "tests"] = "exit_code"
    # Test id (as pytest prints it) → the status it must have; required with reward_from "tests".
    expected_tests: dict[str, TestStatus] | None = Field(default=None, validate_default=True)
    tests_score: Literal["all", "fraction"] = "all"
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
            given = sorted({"reward_from", "tests_score", "timeout_seconds", "fresh_runtime"} & self.model_fields_set)
            if given:
                raise ValueError(f"{given[0]}: applies only with a 'command'")
        if self.reward_from != "tests" and "tests_score" in self.model_fields_set:
            raise ValueError("tests_score: applies only to reward_from 'tests'")
        refuse_idle_fresh_options(self)
        return self


def _test_id(rest: str) -> str:
    """The test id at the start of a summary line's remainder, without the `` - message`` after it."""
    bracket, dash = rest.find("["), rest.find(" - ")
    if bracket != -1 and (dash == -1 or bracket < dash):
        # A parametrized id may itself hold " - ": it ends at the "]" followed by the message or the line's end.
        end = _PARAMETRIZED_END.search(rest, bracket)
        if end:
            return rest[: end.end()]
    return rest if dash == -1 else rest[:dash]


def parse_test_statuses(output: str) -> dict[str, str]:
    """Test id → status, from ``pytest -rA`` summary lines and ``pytest -v`` lines in ``output``."""
    statuses: dict[str, str] = {}
    for raw in output.splitlines():
        line = _ANSI.sub("", raw).rstrip()
        verbose = _VERBOSE_LINE.match(line)
        summary = None if verbose else _SUMMARY_LINE.match(line)
        if verbose:
            test, status = verbose.group(1), verbose.group(2)
        elif summary and not summary.group(2).startswith("["):  # "SKIPPED [1] file.py:3: why" names no test
            test, status = _test_id(summary.group(2)), summary.group(1)
        else:
            continue
        if test not in statuses or STATUS_RANK[status] > STATUS_RANK[statuses[test]]:
            statuses[test] = status
    return statuses


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
        result, output = run_command(runtime, context.task, command, config.timeout_seconds, LOG_NAME)
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
            score = details["number"] = number
        elif config.reward_from == "tests":
            assert config.expected_tests is not None  # the config validator made sure
            details["tests"] = parse_test_statuses(output)
            score, details["mismatched"] = score_tests(config.expected_tests, details["tests"], config.tests_score)
        else:
            score = 1.0 if result.exit_code == 0 else 0.0
        details["score"] = score
        return score, details
