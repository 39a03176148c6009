"""``test_on_output``: each ``reward_from`` mode with real commands in a local runtime, the answer check and its
product with the command's score, the clean runtime, and configs refused at submission."""

from __future__ import annotations

import shlex
import sys
from typing import Any

import pytest

from polar.errors import EvaluationError
from polar.evaluators import EVALUATORS
from polar.evaluators.test_on_output import TestOnOutput, parse_test_statuses, score_tests
from polar.task_request import RuntimeSpec, task_from_json
from tests.polar.evaluators.support import FinishedSession, refused_field
from tests.support import command_task

PYTEST = f"{shlex.quote(sys.executable)} -m pytest -p no:cacheprovider"
TINY_TESTS = """\
import pytest

def test_adds():
    assert 1 + 1 == 2

def test_breaks():
    assert 1 + 1 == 3

@pytest.mark.parametrize("text", ["a - b", "c"])
def test_param(text):
    assert text == "c"
"""


def evaluate(session: FinishedSession, config: dict[str, Any], final_message: str | None = None) -> Any:
    return TestOnOutput(config).evaluate(session.context(final_message))


def test_registered_under_its_name() -> None:
    assert EVALUATORS["test_on_output"] is TestOnOutput


def test_exit_code_mode_checks_what_the_harness_left(session: FinishedSession) -> None:
    session.write("hello.txt", "HELLO\n")
    command = "grep -qx HELLO hello.txt && echo found"
    evaluation = evaluate(session, {"command": command})
    assert evaluation.reward == 1.0
    details = evaluation.details["command"]
    assert details["exit_code"] == 0 and details["timed_out"] is False and details["score"] == 1.0
    assert details["output_tail"] == "found\n" and details["duration_s"] >= 0
    assert (session.runtime.session_dir / "logs" / "evaluator.log").read_text() == "found\n"

    session.write("hello.txt", "GOODBYE\n")
    evaluation = evaluate(session, {"command": command})
    assert evaluation.reward == 0.0
    assert evaluation.details["command"]["exit_code"] == 1


def test_the_output_tail_keeps_the_end(session: FinishedSession) -> None:
    evaluation = evaluate(session, {"command": "seq 1 5000"})
    tail = evaluation.details["command"]["output_tail"]
    assert len(tail) == 2000 and tail.endswith("4999\n5000\n")


def test_a_command_out_of_time_is_the_works_failure(session: FinishedSession) -> None:
    # The work hung its judging: an EvaluationError (postrun scores the task's failure_reward), details kept.
    with pytest.raises(EvaluationError, match=r"the command ran out of its 0.5s") as failed:
        evaluate(session, {"command": "sleep 30", "timeout_seconds": 0.5})
    details = failed.value.details["command"]
    assert details["timed_out"] is True and details["exit_code"] is None and details["duration_s"] < 10


def test_number_mode_takes_the_last_number_printed(session: FinishedSession) -> None:
    evaluation = evaluate(
        session, {"command": "echo 'checked 4 cases'; echo 'score: 0.75' >&2", "reward_from": "number"}
    )
    assert evaluation.reward == 0.75
    assert evaluation.details["command"]["number"] == 0.75
    # Not clamped, and the exit code does not matter.
    assert evaluate(session, {"command": "echo 1,250; exit 3", "reward_from": "number"}).reward == 1250.0
    assert evaluate(session, {"command": "echo -2.5", "reward_from": "number"}).reward == -2.5


def test_number_mode_without_a_number_is_an_error(session: FinishedSession) -> None:
    with pytest.raises(EvaluationError, match=r"printed no number \(it exited with code 2\).*'all good"):
        evaluate(session, {"command": "echo all good; exit 2", "reward_from": "number"})


def test_tests_mode_with_a_real_pytest_run(session: FinishedSession) -> None:
    session.write("test_tiny.py", TINY_TESTS)
    expected = {
        "test_tiny.py::test_adds": "PASSED",
        "test_tiny.py::test_breaks": "FAILED",
        "test_tiny.py::test_param[a - b]": "FAILED",
        "test_tiny.py::test_param[c]": "PASSED",
    }
    config = {"command": f"{PYTEST} -rA test_tiny.py", "reward_from": "tests", "expected_tests": expected}
    evaluation = evaluate(session, config)
    assert evaluation.reward == 1.0  # pytest exits 1, but every test has the expected status
    details = evaluation.details["command"]
    assert details["exit_code"] == 1
    assert details["tests"] == expected and details["mismatched"] == {}

    wanted = {**expected, "test_tiny.py::test_breaks": "PASSED", "test_tiny.py::test_missing": "PASSED"}
    evaluation = evaluate(session, {**config, "expected_tests": wanted})
    assert evaluation.reward == 0.0
    assert evaluation.details["command"]["mismatched"] == {
        "test_tiny.py::test_breaks": {"expected": "PASSED", "found": "FAILED"},
        "test_tiny.py::test_missing": {"expected": "PASSED", "found": None},
    }
    assert evaluate(session, {**config, "expected_tests": wanted, "tests_score": "fraction"}).reward == 3 / 5


def test_tests_mode_reads_verbose_output_too(session: FinishedSession) -> None:
    session.write("test_tiny.py", TINY_TESTS)
    expected = {"test_tiny.py::test_adds": "PASSED", "test_tiny.py::test_param[a - b]": "FAILED"}
    config = {"command": f"{PYTEST} -v test_tiny.py", "reward_from": "tests", "expected_tests": expected}
    assert evaluate(session, config).reward == 1.0


def test_parse_test_statuses() -> None:
    output = "\n".join(
        [
            "tests/t.py::test_a PASSED                                  [ 20%]",
            "tests/t.py::test_s SKIPPED (not today)                     [ 40%]",
            "tests/t.py::test_x XFAIL (known)                           [ 60%]",
            "\x1b[32mPASSED\x1b[0m tests/t.py::test_c",
            "[gw1] [ 80%] PASSED tests/t.py::test_d",
            "SKIPPED [1] tests/t.py:12: not today",  # a location, not a test id
            "FAILED tests/t.py::test_p[x - y] - AssertionError: a - b",
            "ERROR tests/t.py::test_a - RuntimeError: teardown",  # passed, then its teardown failed
            "XPASS tests/t.py::test_y ",
            "PASSED",
            "everything PASSED nicely",
            "=========== 1 failed, 4 passed in 0.12s ===========",
        ]
    )
    assert parse_test_statuses(output) == {
        "tests/t.py::test_a": "ERROR",
        "tests/t.py::test_s": "SKIPPED",
        "tests/t.py::test_x": "XFAIL",
        "tests/t.py::test_c": "PASSED",
        "tests/t.py::test_d": "PASSED",
        "tests/t.py::test_p[x - y]": "FAILED",
        "tests/t.py::test_y": "XPASS",
    }


def test_score_tests() -> None:
    expected = {"a": "PASSED", "b": "FAILED"}
    assert score_tests(expected, {"a": "PASSED", "b": "FAILED", "c": "ERROR"}, "all") == (1.0, {})
    assert score_tests(expected, {"a": "PASSED"}, "all") == (0.0, {"b": {"expected": "FAILED", "found": None}})
    assert score_tests(expected, {"a": "PASSED"}, "fraction")[0] == 0.5


def test_answer_alone_runs_no_command(session: FinishedSession) -> None:
    config = {"answer": {"expected": "391", "match": "numeric", "pattern": r"answer is\s*(-?[\d.,]+)"}}
    evaluation = evaluate(session, config, final_message="The answer is 391.")
    assert evaluation.reward == 1.0
    assert evaluation.details == {
        "answer": {"source": "last_message", "found": "391", "expected": "391", "match": "numeric", "correct": True}
    }
    assert not (session.runtime.session_dir / "logs" / "evaluator.log").exists()
    assert evaluate(session, config, final_message="The answer is 390.").reward == 0.0


def test_reward_is_the_command_score_times_the_answer_score(session: FinishedSession) -> None:
    config = {"command": "echo 0.5", "reward_from": "number", "answer": {"expected": "yes"}}
    assert evaluate(session, config, final_message="yes").reward == 0.5
    evaluation = evaluate(session, config, final_message="no")
    assert evaluation.reward == 0.0
    assert evaluation.details["command"]["score"] == 0.5 and evaluation.details["answer"]["correct"] is False


def test_a_clean_runtime_judges_with_the_harness_work_collected(session: FinishedSession) -> None:
    clean = session.clean_runtime()
    (clean.session_dir / "work" / "test_suite.txt").write_text("pristine\n")  # as a prepare step made it
    session.write("test_suite.txt", "tampered\n")  # the harness changed its copy
    session.write("out.txt", "result\n")
    session.write("scratch.txt", "not collected\n")
    command = "grep -qx pristine test_suite.txt && grep -qx result out.txt && test ! -e scratch.txt"
    evaluator = TestOnOutput({"command": command, "fresh_runtime": True, "collect": ["out.txt", "never-made.txt"]})
    evaluation = evaluator.evaluate(session.context())
    assert evaluation.reward == 1.0, evaluation.details
    assert evaluation.details["command"]["collected"] == ["out.txt"]
    assert (clean.session_dir / "logs" / "evaluator.log").exists()
    assert not (session.runtime.session_dir / "logs" / "evaluator.log").exists()


def test_collect_defaults_to_the_whole_work_directory(session: FinishedSession) -> None:
    session.clean_runtime()
    session.write("a.txt", "a")
    session.write("sub/b.txt", "b")
    evaluation = TestOnOutput({"command": "cat a.txt sub/b.txt", "fresh_runtime": True}).evaluate(session.context())
    assert evaluation.reward == 1.0
    assert evaluation.details["command"]["collected"] == ["a.txt", "sub"]


def test_without_its_clean_runtime_judging_fails(session: FinishedSession) -> None:
    with pytest.raises(RuntimeError, match="clean evaluator runtime is gone"):
        TestOnOutput({"command": "true", "fresh_runtime": True}).evaluate(session.context())


def test_fresh_runtime_spec() -> None:
    task = task_from_json(command_task("t", "true", runtime={"prepare": [{"run": "echo hi > x"}]}))
    assert TestOnOutput({"command": "true"}).fresh_runtime(task) is None
    assert TestOnOutput({"command": "true", "fresh_runtime": True}).fresh_runtime(task) == task.runtime
    own = {"prepare": [{"run": "echo other > x"}]}
    spec = TestOnOutput({"command": "true", "fresh_runtime": True, "runtime": own}).fresh_runtime(task)
    assert spec == RuntimeSpec.model_validate(own)


@pytest.mark.parametrize(
    ("config", "refused"),
    [
        ({}, "config: needs a 'command', an 'answer', or both"),
        ({"command": ""}, "config.command: String should have at least 1 character"),
        ({"command": "true", "reward_from": "stdout"}, "config.reward_from: Input should be 'exit_code', 'number'"),
        ({"command": "true", "reward_from": "tests"}, "config.expected_tests: required (a non-empty mapping"),
        ({"command": "true", "reward_from": "tests", "expected_tests": {}}, "config.expected_tests: required"),
        ({"command": "true", "expected_tests": {"t": "PASSED"}}, "config.expected_tests: applies only to reward_from"),
        (
            {"command": "true", "reward_from": "tests", "expected_tests": {"t": "passed"}},
            "config.expected_tests.t: Input should be 'PASSED'",
        ),
        ({"command": "true", "tests_score": "fraction"}, "config: tests_score: applies only to reward_from 'tests'"),
        ({"command": "true", "collect": ["out.txt"]}, "config: collect: applies only with fresh_runtime true"),
        ({"command": "true", "runtime": {}}, "config: runtime: applies only with fresh_runtime true"),
        ({"command": "true", "timeout_seconds": 0}, "config.timeout_seconds: Input should be greater than 0"),
        ({"answer": {"expected": "1"}, "reward_from": "number"}, "config: reward_from: applies only with a 'command'"),
        ({"answer": {"expected": "1"}, "fresh_runtime": True}, "config: fresh_runtime: applies only with a 'command'"),
        ({"command": "true", "comand": "x"}, "config.comand: unknown field"),
    ],
)
def test_bad_configs_are_refused_naming_the_field(config: dict[str, Any], refused: str) -> None:
    assert refused_field("test_on_output", config).startswith(f"tasks[0].evaluator.{refused}")
