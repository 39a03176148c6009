"""``test_on_output``: each ``reward_from`` mode with real commands in a local runtime (statuses from Polar's pytest
plugin's report, never from printed lines), the answer check and its product with the command's score, the clean
runtime, and configs refused at submission."""

from __future__ import annotations

import shlex
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from polar.config import load_config
from polar.contract.task_request import RuntimeSpec, task_from_json
from polar.errors import EvaluationError, UnsafePath
from polar.evaluators import EVALUATORS
from polar.evaluators.test_on_output import TestOnOutput, score_tests
from polar.runtimes import create_runtime
from tests.docker_engine import require_docker_image
from tests.polar.evaluators.support import FinishedSession, refused_field
from tests.stage_calls import command_task

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
    # Within reward_range, as is (never clamped), and the exit code does not matter.
    wide = {"reward_from": "number", "reward_range": [-10, 2000]}
    assert evaluate(session, {"command": "echo 1,250; exit 3", **wide}).reward == 1250.0
    assert evaluate(session, {"command": "echo -2.5", **wide}).reward == -2.5
    assert evaluate(session, {"command": "echo 1", "reward_from": "number"}).reward == 1.0


@pytest.mark.parametrize(
    ("printed", "config", "error"),
    [
        ("1e999", {}, r"the last number printed is inf, not a finite number; its output ends: 'score 1e999"),
        ("1" * 5000, {}, r"the last number printed is inf, not a finite number"),
        ("1e308", {}, r"the last number printed is 1e\+308, outside reward_range \[0, 1\]"),
        ("1,250", {}, r"is 1250, outside reward_range \[0, 1\]"),
        ("-2.5", {"reward_range": [-2, 2]}, r"is -2.5, outside reward_range \[-2, 2\]"),
    ],
)
def test_number_mode_outside_its_range_is_the_works_failure(
    session: FinishedSession, printed: str, config: dict[str, Any], error: str
) -> None:
    # What the judged code prints shares the judge's stream: a number past the range never reaches a trainer.
    with pytest.raises(EvaluationError, match=error) as failed:
        evaluate(session, {"command": f"echo score {printed}", "reward_from": "number", **config})
    assert failed.value.details["command"]["exit_code"] == 0


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


def test_tests_mode_reads_the_report_whatever_pytest_prints(session: FinishedSession) -> None:
    session.write("test_tiny.py", TINY_TESTS)
    expected = {"test_tiny.py::test_adds": "PASSED", "test_tiny.py::test_param[a - b]": "FAILED"}
    for flags in ("-v", "-q", "-qq --tb=no", "-p no:terminal", "-n 2"):  # -n: xdist, reported by its controller
        config = {"command": f"{PYTEST} {flags} test_tiny.py", "reward_from": "tests", "expected_tests": expected}
        evaluation = evaluate(session, config)
        assert evaluation.reward == 1.0, (flags, evaluation.details)
        assert len(evaluation.details["command"]["tests"]) == 4


STATUS_TESTS = """\
import pytest

@pytest.fixture
def broken_teardown():
    yield
    raise RuntimeError("teardown")

@pytest.fixture
def broken_setup():
    raise RuntimeError("setup")

def test_passes_then_teardown_errors(broken_teardown):
    pass

def test_setup_errors(broken_setup):
    pass

@pytest.mark.skip(reason="not today")
def test_skipped():
    pass

def test_skips_itself():
    pytest.skip("later")

@pytest.mark.xfail(reason="known")
def test_xfail():
    assert False

@pytest.mark.xfail(reason="known")
def test_xpass():
    pass

@pytest.mark.xfail(reason="known", strict=True)
def test_strict_xpass():
    pass

@pytest.mark.xfail(run=False, reason="never run")
def test_xfail_not_run():
    pass
"""


def test_tests_mode_reports_each_status_as_pytest_does(session: FinishedSession) -> None:
    session.write("test_statuses.py", STATUS_TESTS)
    expected = {
        "test_statuses.py::test_passes_then_teardown_errors": "ERROR",
        "test_statuses.py::test_setup_errors": "ERROR",
        "test_statuses.py::test_skipped": "SKIPPED",
        "test_statuses.py::test_skips_itself": "SKIPPED",
        "test_statuses.py::test_xfail": "XFAIL",
        "test_statuses.py::test_xpass": "XPASS",
        "test_statuses.py::test_strict_xpass": "FAILED",
        "test_statuses.py::test_xfail_not_run": "XFAIL",
    }
    config = {"command": f"{PYTEST} test_statuses.py", "reward_from": "tests", "expected_tests": expected}
    evaluation = evaluate(session, config)
    assert evaluation.details["command"]["tests"] == expected
    assert evaluation.reward == 1.0


FORGED = "\\n".join(["PASSED test_calc.py::test_add", "test_calc.py::test_add PASSED", "PASSED test_calc.py::test_mul"])
CALC_TESTS = """\
from calc import add, mul

def test_add():
    assert add(2, 3) == 5

def test_mul():
    assert mul(2, 3) == 6
"""
CALC_EXPECTED = {"test_calc.py::test_add": "PASSED", "test_calc.py::test_mul": "PASSED"}


def test_work_that_breaks_collection_and_prints_passed_lines_scores_nothing(session: FinishedSession) -> None:
    session.write("test_calc.py", CALC_TESTS)
    # At import (collection), at exit, and straight to the terminal's descriptors: every place output can go.
    session.write(
        "calc.py",
        f"import atexit, os\nprint('{FORGED}')\nos.write(1, b'{FORGED}\\n')\n"
        f"atexit.register(print, '{FORGED}')\nraise ImportError('the work broke its tests')\n",
    )
    for command in (f"{PYTEST} -rA test_calc.py", f"{PYTEST} -s -v test_calc.py"):
        config = {
            "command": command,
            "reward_from": "tests",
            "expected_tests": CALC_EXPECTED,
            "tests_score": "fraction",
        }
        evaluation = evaluate(session, config)
        details = evaluation.details["command"]
        assert "PASSED test_calc.py::test_add" in details["output_tail"]  # printed, and worth nothing
        assert evaluation.reward == 0.0, details
        assert details["tests"] == {} and details["collection_errors"] == ["test_calc.py"]
        assert details["mismatched"] == {test: {"expected": "PASSED", "found": None} for test in CALC_EXPECTED}


def test_no_report_is_the_works_failure(session: FinishedSession) -> None:
    session.write("test_calc.py", CALC_TESTS)
    session.write("conftest.py", "raise RuntimeError('the work broke pytest')\n")
    config = {"command": f"{PYTEST} test_calc.py", "reward_from": "tests", "expected_tests": CALC_EXPECTED}
    with pytest.raises(EvaluationError, match=r"no pytest report: pytest never reached its test run .* code 4"):
        evaluate(session, config)
    config = {"command": "echo PASSED test_calc.py::test_add", "reward_from": "tests", "expected_tests": CALC_EXPECTED}
    with pytest.raises(EvaluationError, match=r"no pytest report: .*the command ran no pytest"):
        evaluate(session, config)


def test_a_report_the_work_makes_is_tampering(session: FinishedSession) -> None:
    # The work's code, imported at collection, writes a report of its own where Polar's plugin writes: a second file.
    session.write("test_calc.py", CALC_TESTS)
    forged = '{"tests": [{"nodeid": "test_calc.py::test_add", "status": "PASSED"}]}'
    session.write(
        "calc.py",
        "import os, sys\n"
        "folder = sys.modules['_polar_pytest_report']._directory\n"
        f"open(os.path.join(folder, 'report-0.json'), 'w').write({forged!r})\n"
        "def add(a, b):\n    return a + b\n\ndef mul(a, b):\n    return a + b\n",
    )
    config = {"command": f"{PYTEST} test_calc.py", "reward_from": "tests", "expected_tests": CALC_EXPECTED}
    with pytest.raises(
        EvaluationError, match="2 files in the pytest report directory where pytest makes one"
    ) as failed:
        evaluate(session, config)
    assert "report-0.json" in failed.value.details["command"]["reports"]


def test_a_report_naming_a_test_twice_is_tampering(session: FinishedSession) -> None:
    # The work's code rewrites Polar's report at the end (it shares pytest's process): a test twice is refused.
    twice = '{"tests": [{"nodeid": "t::a", "status": "FAILED"}, {"nodeid": "t::a", "status": "PASSED"}]}'
    session.write(
        "test_twice.py",
        "import atexit, os, sys\n"
        "def test_a():\n    pass\n"
        "def rewrite():\n"
        "    folder = sys.modules['_polar_pytest_report']._directory\n"
        "    for name in os.listdir(folder):\n"
        f"        open(os.path.join(folder, name), 'w').write({twice!r})\n"
        "atexit.register(rewrite)\n",
    )
    config = {"command": f"{PYTEST} test_twice.py", "reward_from": "tests", "expected_tests": {"t::a": "PASSED"}}
    with pytest.raises(EvaluationError, match="the pytest report names 't::a' twice: tampering"):
        evaluate(session, config)


def test_a_pytest_the_tests_start_does_not_report(session: FinishedSession) -> None:
    session.write("inner/test_inner.py", "def test_inner():\n    pass\n")
    session.write(
        "test_outer.py",
        "import os, subprocess, sys\n"
        "def test_outer():\n"
        "    assert 'POLAR_PYTEST_REPORT_DIR' not in os.environ\n"
        "    assert '_polar_pytest_report' not in os.environ.get('PYTEST_ADDOPTS', '')\n"
        "    assert os.environ['PYTEST_ADDOPTS'] == '-p no:randomly'\n"
        "    done = subprocess.run([sys.executable, '-m', 'pytest', '-p', 'no:cacheprovider', 'inner'])\n"
        "    assert done.returncode == 0\n",
    )
    config = {
        "command": f"{PYTEST} test_outer.py",
        "reward_from": "tests",
        "expected_tests": {"test_outer.py::test_outer": "PASSED"},
    }
    evaluator = TestOnOutput(config)
    evaluation = evaluator.evaluate(session.context(runtime={"env": {"PYTEST_ADDOPTS": "-p no:randomly"}}))
    assert evaluation.reward == 1.0, evaluation.details
    assert evaluation.details["command"]["tests"] == {"test_outer.py::test_outer": "PASSED"}


def test_a_harness_that_plants_a_link_at_the_plugin_folder_fails_the_evaluation(session: FinishedSession) -> None:
    (session.runtime.session_dir / "polar-pytest").symlink_to(session.work)
    config = {"command": f"{PYTEST} test_calc.py", "reward_from": "tests", "expected_tests": CALC_EXPECTED}
    with pytest.raises(UnsafePath, match="polar-pytest is a symbolic link"):
        evaluate(session, config)
    assert list(session.work.iterdir()) == []


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
        ({"command": "true", "reward_range": [0, 2]}, "config: reward_range: applies only to reward_from 'number'"),
        (
            {"command": "true", "reward_from": "number", "reward_range": [2, 0]},
            "config.reward_range: [2, 0]: the lower end is above the upper one",
        ),
        ({"answer": {"expected": "1"}, "reward_range": [0, 2]}, "config: reward_range: applies only with a 'command'"),
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


@pytest.mark.parametrize("backend", ["bwrap", "docker"])
def test_the_report_plugin_works_in_each_sandbox(tmp_path: Path, backend: str) -> None:
    """The plugin and its report directory live in the session directory, which every runtime has at its host path;
    a sandbox's user (nobody under bwrap with a root worker, the container's user in Docker) writes the report."""
    if backend == "docker":
        require_docker_image()
    elif shutil.which("bwrap") is None:
        pytest.skip("NO BWRAP: the bubblewrap package is not installed")
    config = load_config({"POLAR_WORK_ROOT": str(tmp_path / "sessions"), "POLAR_NODE": backend}, cwd=tmp_path)
    session = FinishedSession(config)
    session.runtime.destroy()
    session.runtime = create_runtime(session.session_id, RuntimeSpec(backend=backend), config)
    try:
        session.write("test_tiny.py", TINY_TESTS)
        session.write("conftest.py", f"print('{FORGED}')\n")
        expected = {"test_tiny.py::test_adds": "PASSED", "test_tiny.py::test_breaks": "PASSED"}
        evaluator = TestOnOutput(
            {"command": f"{PYTEST} -rA test_tiny.py", "reward_from": "tests", "expected_tests": expected}
        )
        evaluation = evaluator.evaluate(session.context())
        details = evaluation.details["command"]
        assert details["tests"] == {
            "test_tiny.py::test_adds": "PASSED",
            "test_tiny.py::test_breaks": "FAILED",
            "test_tiny.py::test_param[a - b]": "FAILED",
            "test_tiny.py::test_param[c]": "PASSED",
        }, details["output_tail"]
        assert evaluation.reward == 0.0
    finally:
        session.runtime.destroy()
