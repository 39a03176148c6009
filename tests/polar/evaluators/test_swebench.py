"""The ``swebench`` evaluator on a tiny SWE-bench-format instance in real local runtimes: the diff taken from the
session's repository, applied in the clean one, the test patch applied over it, swebench's grading."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from polar.contract.task_request import EvaluatorSpec, RuntimeSpec, task_from_json
from polar.errors import EvaluationError
from polar.evaluators import Evaluation, load_evaluator
from polar.evaluators.swebench import SWEBench
from polar.runtimes.base import Runtime
from tests.polar.evaluators.support import FinishedSession, refused_field
from tests.stage_calls import command_task
from tests.swebench_repo import BREAKS_ADD, FIXED, PARTIAL, TEST_CMD, WRONG, SweRepo, build_swe_repo

F2P = ["tests/test_calc.py::test_mul", "tests/test_table.py::test_table"]
P2P = ["tests/test_calc.py::test_add"]


@pytest.fixture
def swe(tmp_path: Path) -> SweRepo:
    return build_swe_repo(tmp_path / "origin")


def _checkout(runtime: Runtime, swe: SweRepo) -> None:
    """What the task's prepare steps do: the repository copied into the work directory, at base_commit."""
    runtime.copy_in(swe.path, ".")
    result = runtime.exec(["git", "checkout", "-q", "--detach", swe.base_commit], {}, 30, log_name="prepare")
    assert result.exit_code == 0, result.output_tail


def _config(swe: SweRepo, **extra: Any) -> dict[str, Any]:
    return {"instance": swe.instance, "repo_dir": ".", "test_cmd": TEST_CMD, **extra}


def _evaluate(session: FinishedSession, swe: SweRepo, harness_leaves: str | None, **extra: Any) -> Evaluation:
    """Prepare both runtimes, let the "harness" write calc.py (None: change nothing), evaluate."""
    _checkout(session.runtime, swe)
    _checkout(session.clean_runtime(), swe)
    if harness_leaves is not None:
        session.write("calc.py", harness_leaves)
    return SWEBench(_config(swe, **extra)).evaluate(session.context())


def test_the_right_fix_resolves_the_instance(session: FinishedSession, swe: SweRepo) -> None:
    evaluation = _evaluate(session, swe, FIXED)
    details = evaluation.details
    assert evaluation.reward == 1.0, details["log_tail"]
    assert details["instance_id"] == "polar__calc-1"
    assert (details["resolved"], details["resolution_status"]) == (True, "RESOLVED_FULL")
    assert (details["patch_is_empty"], details["patch_applied"], details["test_patch_applied"]) == (False, True, True)
    assert details["tests_status"] == {
        "FAIL_TO_PASS": {"success": F2P, "failure": []},
        "PASS_TO_PASS": {"success": P2P, "failure": []},
        "FAIL_TO_FAIL": {"success": [], "failure": []},
        "PASS_TO_FAIL": {"success": [], "failure": []},
    }
    assert details["test_results"] == dict.fromkeys([*P2P, *F2P], "PASSED")
    assert details["test_exit_code"] == 0 and details["tests_timed_out"] is False
    assert details["model_patch"] == swe.diff_for(FIXED) and "+    return a * b" in details["model_patch"]
    assert "End Test Output" in details["log_tail"]


@pytest.mark.parametrize(
    ("content", "status", "f2p_failing", "p2p_failing"),
    [
        (WRONG, "RESOLVED_NO", F2P, []),
        (PARTIAL, "RESOLVED_PARTIAL", F2P[1:], []),
        (BREAKS_ADD, "RESOLVED_NO", [], P2P),
    ],
    ids=["wrong", "partial", "breaks-a-passing-test"],
)
def test_a_fix_short_of_full_gets_nothing(
    session: FinishedSession,
    swe: SweRepo,
    content: str,
    status: str,
    f2p_failing: list[str],
    p2p_failing: list[str],
) -> None:
    evaluation = _evaluate(session, swe, content)
    details = evaluation.details
    assert evaluation.reward == 0.0
    assert (details["resolved"], details["resolution_status"], details["patch_applied"]) == (False, status, True)
    assert details["tests_status"]["FAIL_TO_PASS"]["failure"] == f2p_failing
    assert details["tests_status"]["PASS_TO_PASS"]["failure"] == p2p_failing
    assert details["test_exit_code"] == 1


def test_no_change_runs_the_tests_on_the_base_and_gets_nothing(session: FinishedSession, swe: SweRepo) -> None:
    details = _evaluate(session, swe, None).details
    assert (details["patch_is_empty"], details["patch_applied"], details["model_patch"]) == (True, False, "")
    assert (details["resolved"], details["resolution_status"]) == (False, "RESOLVED_NO")
    # The base as SWE-bench expects it: FAIL_TO_PASS fails, PASS_TO_PASS passes.
    assert details["tests_status"]["FAIL_TO_PASS"] == {"success": [], "failure": F2P}
    assert details["tests_status"]["PASS_TO_PASS"] == {"success": P2P, "failure": []}
    assert details["test_patch_applied"] is True and details["test_exit_code"] == 1


def test_new_files_are_part_of_the_patch_and_ignored_ones_are_not(session: FinishedSession, swe: SweRepo) -> None:
    _checkout(session.runtime, swe)
    _checkout(session.clean_runtime(), swe)
    session.write("ops/times.py", "def times(a, b):\n    return a * b\n")
    session.write("calc.py", "from ops.times import times\n\n\ndef add(a, b):\n    return a + b\n\n\nmul = times\n")
    session.write("__pycache__/calc.cpython-311.pyc", "ignored by the repository's .gitignore")
    evaluation = SWEBench(_config(swe)).evaluate(session.context())
    patch = evaluation.details["model_patch"]
    assert "diff --git a/ops/times.py b/ops/times.py\nnew file mode" in patch and "__pycache__" not in patch
    assert evaluation.reward == 1.0, evaluation.details["log_tail"]


def test_the_harness_cannot_pass_by_editing_the_tests(session: FinishedSession, swe: SweRepo) -> None:
    """Test files the test patch touches are reset (or removed when it adds them) before it applies."""
    _checkout(session.runtime, swe)
    _checkout(session.clean_runtime(), swe)
    session.write("tests/test_table.py", "def test_table():\n    pass\n")
    session.write("tests/test_calc.py", "def test_add():\n    pass\n\n\ndef test_mul():\n    pass\n")
    details = SWEBench(_config(swe)).evaluate(session.context()).details
    assert details["patch_applied"] is True and details["test_patch_applied"] is True
    assert details["resolution_status"] == "RESOLVED_NO"
    assert details["tests_status"]["FAIL_TO_PASS"]["failure"] == F2P


ALL_PASSED = """\
import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    outcome.get_result().outcome = "passed"
"""


@pytest.mark.parametrize("revert", [True, False], ids=["reverted", "kept"])
def test_a_conftest_that_passes_every_test_is_reverted(session: FinishedSession, swe: SweRepo, revert: bool) -> None:
    """Only the files the test patch touches are reset: a root conftest.py survives into the clean runtime unless
    the patch's test configuration is dropped (``revert_test_config``, default true)."""
    _checkout(session.runtime, swe)
    _checkout(session.clean_runtime(), swe)
    session.write("conftest.py", ALL_PASSED)
    session.write("calc.py", WRONG)
    config = _config(swe) if revert else _config(swe, revert_test_config=False)
    evaluation = SWEBench(config).evaluate(session.context())
    details = evaluation.details
    assert details["test_config_files"] == ["conftest.py"]
    assert "diff --git a/conftest.py b/conftest.py" in details["model_patch"]  # the model's patch, as it made it
    if revert:
        assert details["test_config_reverted"] == ["conftest.py"]
        assert (evaluation.reward, details["resolution_status"]) == (0.0, "RESOLVED_NO"), details["log_tail"]
        assert details["patch_applied"] is True
    else:  # what the default prevents: every test "passes"
        assert details["test_config_reverted"] == []
        assert (evaluation.reward, details["resolution_status"]) == (1.0, "RESOLVED_FULL"), details["log_tail"]


def test_a_patch_of_only_test_configuration_tests_the_base(session: FinishedSession, swe: SweRepo) -> None:
    _checkout(session.runtime, swe)
    _checkout(session.clean_runtime(), swe)
    session.write("conftest.py", ALL_PASSED)
    details = SWEBench(_config(swe)).evaluate(session.context()).details
    assert (details["patch_is_empty"], details["patch_applied"], details["test_config_reverted"]) == (
        False,
        False,
        ["conftest.py"],
    )
    assert details["resolution_status"] == "RESOLVED_NO" and details["test_patch_applied"] is True


def test_a_patch_over_its_limit_is_the_works_failure(session: FinishedSession, swe: SweRepo) -> None:
    _checkout(session.runtime, swe)
    _checkout(session.clean_runtime(), swe)
    session.write("calc.py", FIXED)
    with open(session.work / "blob.bin", "wb") as handle:  # 4 GiB by its size (sparse), never read
        handle.truncate(4 * 1024**3)
    with pytest.raises(
        EvaluationError, match=r"the model patch is over max_patch_bytes \(16777216\): the new"
    ) as failed:
        SWEBench(_config(swe)).evaluate(session.context())
    details = failed.value.details
    assert (details["patch_too_large"], details["max_patch_bytes"]) == (True, 16 * 1024 * 1024)
    assert details["largest_changes"][-1] == f"{4 * 1024**3} blob.bin"
    assert not (session.fresh.session_dir / "swebench").exists()  # nothing reached the clean runtime

    (session.work / "blob.bin").unlink()
    with pytest.raises(EvaluationError, match=r"over max_patch_bytes \(100\): the diff is longer"):
        SWEBench(_config(swe, max_patch_bytes=100)).evaluate(session.context())


def test_a_patch_that_does_not_apply_is_not_tested(session: FinishedSession, swe: SweRepo) -> None:
    _checkout(session.runtime, swe)
    clean = session.clean_runtime()
    _checkout(clean, swe)
    diverge = "printf 'VALUE = 1\\n' > calc.py && git -c user.name=x -c user.email=x@x commit -qam diverge"
    assert clean.exec(["/bin/sh", "-c", diverge], {}, 30, log_name="prepare").exit_code == 0
    session.write("calc.py", FIXED)
    evaluation = SWEBench(_config(swe)).evaluate(session.context())
    details = evaluation.details
    assert evaluation.reward == 0.0
    assert (details["patch_is_empty"], details["patch_applied"], details["test_patch_applied"]) == (False, False, None)
    assert (details["resolved"], details["resolution_status"]) == (False, "RESOLVED_NO")
    assert details["test_results"] == {} and details["test_exit_code"] is None
    assert details["tests_status"]["FAIL_TO_PASS"]["failure"] == F2P
    assert "Patch Apply Failed" in details["log_tail"]


def test_a_session_without_the_repository_fails_loudly(session: FinishedSession, swe: SweRepo) -> None:
    # The harness removed (or broke) its repository: the work's failure, which scores the failure reward.
    _checkout(session.clean_runtime(), swe)
    with pytest.raises(EvaluationError, match="cannot take the harness's diff"):
        SWEBench(_config(swe)).evaluate(session.context())


def _own_eval_script(swe: SweRepo) -> str:
    """A SWE-bench 5 row's eval_script, written the way the dataset's are (repository path fixed in it)."""
    tests = "tests/test_calc.py tests/test_table.py"
    return "\n".join(
        [
            "#!/bin/bash",
            "set -uxo pipefail",
            'cd "$SWE_REPO"',
            f"git checkout {swe.base_commit} tests/test_calc.py",
            "rm -f tests/test_table.py",
            "git apply -v - <<'EOF_114329324912'",
            swe.instance["test_patch"].rstrip("\n"),
            "EOF_114329324912",
            ": '>>>>> Start Test Output'",
            f"{TEST_CMD} {tests}",
            ": '>>>>> End Test Output'",
            f"git checkout {swe.base_commit} tests/test_calc.py",
        ]
    )


def test_a_swebench5_row_runs_its_own_eval_script(session: FinishedSession, swe: SweRepo) -> None:
    instance = {**swe.instance, "eval_script": _own_eval_script(swe), "log_parser": "parse_log_pytest"}
    _checkout(session.runtime, swe)
    _checkout(session.clean_runtime(), swe)
    session.write("calc.py", FIXED)
    task = {"runtime": {"env": {"SWE_REPO": str(session.fresh.session_dir / "work")}}}
    config = {"instance": instance, "repo_dir": "."}
    evaluation = SWEBench(config).evaluate(session.context(**task))
    details = evaluation.details
    assert evaluation.reward == 1.0, details["log_tail"]
    assert details["test_patch_applied"] is None  # the row's script does not say
    assert details["test_exit_code"] == 0


def test_the_clean_runtime_is_the_task_runtime_unless_configured(swe: SweRepo) -> None:
    task = task_from_json(command_task("t", "true", runtime={"backend": "local", "env": {"A": "1"}}))
    assert SWEBench(_config(swe)).fresh_runtime(task) == task.runtime
    other = {"backend": "local", "prepare": [{"run": "true"}]}
    assert SWEBench(_config(swe, runtime=other)).fresh_runtime(task) == RuntimeSpec.model_validate(other)


def test_defaults_and_lists_given_as_lists(swe: SweRepo) -> None:
    row = {**swe.instance, "FAIL_TO_PASS": F2P, "PASS_TO_PASS": [], "version": 3.0}
    evaluator = load_evaluator(EvaluatorSpec(name="swebench", config={"instance": row}))
    assert isinstance(evaluator, SWEBench)
    config = evaluator.config
    assert (config.repo_dir, config.test_cmd, config.timeout_seconds) == ("/testbed", None, 1800.0)
    assert config.instance.FAIL_TO_PASS == F2P and config.instance.version == "3.0"
    assert config.instance.model_extra is not None and config.instance.model_extra["problem_statement"]


def _without(row: dict[str, Any], key: str) -> dict[str, Any]:
    return {name: value for name, value in row.items() if name != key}


@pytest.mark.parametrize(
    ("change", "refused"),
    [
        (lambda row: {}, "tasks[0].evaluator.config.instance: required field is missing"),
        (lambda row: {"instance": _without(row, "base_commit")}, "config.instance.base_commit: required field"),
        (lambda row: {"instance": {**row, "FAIL_TO_PASS": "[oops"}}, "config.instance.FAIL_TO_PASS: not a JSON list"),
        (lambda row: {"instance": {**row, "FAIL_TO_PASS": "[]"}}, "config.instance.FAIL_TO_PASS: List should have"),
        (lambda row: {"instance": {**row, "PASS_TO_PASS": [1]}}, "config.instance.PASS_TO_PASS[0]: Input should be"),
        (lambda row: {"instance": {**row, "test_patch": "tests"}}, "config.instance.test_patch: not a git diff"),
        (lambda row: {"instance": {**row, "log_parser": "nope"}}, "config.instance.log_parser: 'nope' is not"),
        (lambda row: {"instance": row, "log_parser": "parse_log_nope"}, "config.log_parser: 'parse_log_nope' is not"),
        (lambda row: {"instance": row, "timeout_seconds": 0}, "config.timeout_seconds: Input should be greater"),
        (lambda row: {"instance": row, "repo_dir": ""}, "config.repo_dir: String should have at least 1"),
        (lambda row: {"instance": row, "command": "pytest"}, "tasks[0].evaluator.config.command: unknown field"),
        (lambda row: {"instance": row, "max_patch_bytes": 0}, "config.max_patch_bytes: Input should be greater"),
    ],
    ids=[
        "no-instance",
        "no-base-commit",
        "bad-json",
        "no-fail-to-pass",
        "not-a-name",
        "not-a-diff",
        "row-parser",
        "parser",
        "timeout",
        "repo-dir",
        "unknown-key",
        "max-patch-bytes",
    ],
)
def test_a_bad_config_is_refused_naming_the_field(swe: SweRepo, change: Any, refused: str) -> None:
    assert refused in refused_field("swebench", change(swe.instance))


def test_without_the_swebench_package_the_config_says_what_to_install(
    swe: SweRepo, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delitem(sys.modules, "polar.evaluators.swebench_script", raising=False)
    monkeypatch.setitem(sys.modules, "swebench.harness.grading", None)  # what a missing package looks like
    message = refused_field("swebench", {"instance": swe.instance})
    assert message.startswith("tasks[0].evaluator.config: ") and "pip install 'polar[swebench]'" in message


def test_the_fixture_patches_are_real_diffs(swe: SweRepo, tmp_path: Path) -> None:
    """The gold patch and the test patch apply to base_commit with git (as SWE-bench's rows do)."""
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(swe.path), str(clone)], check=True)
    subprocess.run(["git", "checkout", "-q", swe.base_commit], cwd=clone, check=True)
    for name in ("patch", "test_patch"):
        (tmp_path / name).write_text(swe.instance[name])
        command = f"git apply --check {shlex.quote(str(tmp_path / name))}"
        assert subprocess.run(command, shell=True, cwd=clone).returncode == 0, name
