"""The SWE-bench side of the ``swebench`` evaluator on its own: the scripts run with bash on a real git repository,
the eval script's shape, the TestSpec it hands swebench, and swebench's grading of hand-made logs."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from polar.evaluators.swebench import SWEBenchInstance
from polar.evaluators.swebench_script import (
    NO_REPOSITORY_EXIT,
    OVER_LIMIT_EXIT,
    apply_script,
    diff_script,
    eval_lines,
    grade,
    known_parser,
    reached_tests,
    spec_for,
)
from tests.swebench_repo import FIXED, SweRepo, build_swe_repo

F2P = ["tests/test_calc.py::test_mul", "tests/test_table.py::test_table"]
P2P = ["tests/test_calc.py::test_add"]
LIMIT = 16 * 1024 * 1024


@pytest.fixture
def swe(tmp_path: Path) -> SweRepo:
    return build_swe_repo(tmp_path / "origin")


def _instance(swe: SweRepo, **changes: Any) -> SWEBenchInstance:
    return SWEBenchInstance.model_validate({**swe.instance, **changes})


def _bash(script: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", script], cwd=cwd, capture_output=True, text=True)


def test_the_diff_leaves_the_harness_index_alone(swe: SweRepo, tmp_path: Path) -> None:
    (swe.path / "calc.py").write_text(FIXED)
    (swe.path / "staged.txt").write_text("staged by the harness\n")
    subprocess.run(["git", "add", "staged.txt"], cwd=swe.path, check=True)
    before = _bash("git status --porcelain", swe.path).stdout
    assert _bash(diff_script(".", swe.base_commit, tmp_path / "out", LIMIT), swe.path).returncode == 0
    patch = (tmp_path / "out" / "model.patch").read_text()
    assert "diff --git a/calc.py b/calc.py" in patch and "diff --git a/staged.txt b/staged.txt" in patch
    assert _bash("git status --porcelain", swe.path).stdout == before


def _objects(repo: Path) -> int:
    """The bytes of the repository's object store."""
    return sum(path.stat().st_size for path in (repo / ".git" / "objects").rglob("*") if path.is_file())


@pytest.mark.parametrize("tracked", [False, True], ids=["new-file", "grown-file"])
def test_a_multi_gigabyte_file_is_measured_never_read(swe: SweRepo, tmp_path: Path, tracked: bool) -> None:
    # Sparse: 4 GiB by its size, no disk; git add would have copied it into the object store.
    name = "calc.py" if tracked else "blob.bin"
    with open(swe.path / name, "ab") as handle:
        handle.truncate(4 * 1024**3)
    before = _objects(swe.path)
    done = _bash(diff_script(".", swe.base_commit, tmp_path / "out", LIMIT), swe.path)
    assert done.returncode == OVER_LIMIT_EXIT, done.stderr
    assert (tmp_path / "out" / "over").read_text() == f"the new and changed files hold {4 * 1024**3} bytes\n"
    assert (tmp_path / "out" / "changed.sizes").read_text().splitlines()[-1] == f"{4 * 1024**3} {name}"
    assert not (tmp_path / "out" / "model.patch").exists()
    assert _objects(swe.path) == before


def test_content_the_harness_committed_is_measured_too(swe: SweRepo, tmp_path: Path) -> None:
    # Already in the object store (the harness committed it): nothing new to copy, but the diff would load it.
    (swe.path / "data.bin").write_bytes(b"x" * 5000)
    commit = "git add data.bin && git -c user.name=x -c user.email=x@x commit -qm data"
    assert _bash(commit, swe.path).returncode == 0
    done = _bash(diff_script(".", swe.base_commit, tmp_path / "out", 1000), swe.path)
    assert done.returncode == OVER_LIMIT_EXIT, done.stderr
    assert (tmp_path / "out" / "over").read_text() == "the changed files' new content holds 5000 bytes\n"
    assert not (tmp_path / "out" / "model.patch").exists()


def test_a_diff_longer_than_the_limit_is_cut_and_refused(swe: SweRepo, tmp_path: Path) -> None:
    (swe.path / "calc.py").write_text("x = 1\n" * 30)  # 180 bytes of files, a longer diff (the old lines too)
    done = _bash(diff_script(".", swe.base_commit, tmp_path / "out", 200), swe.path)
    assert done.returncode == OVER_LIMIT_EXIT, done.stderr
    assert (tmp_path / "out" / "over").read_text() == "the diff is longer\n"
    assert (tmp_path / "out" / "model.patch").stat().st_size == 201
    assert _bash(diff_script(".", swe.base_commit, tmp_path / "ok", 2000), swe.path).returncode == 0
    assert (tmp_path / "ok" / "model.patch").read_text().endswith("+x = 1\n")


def test_the_pyproject_diff_holds_whole_files(swe: SweRepo, tmp_path: Path) -> None:
    table = "[tool.pytest.ini_options]\naddopts = '-q'\n" + "".join(f"k{i} = {i}\n" for i in range(20))
    subprocess.run(["git", "checkout", "-q", "-b", "with-pyproject"], cwd=swe.path, check=True)
    (swe.path / "pyproject.toml").write_text(table)
    subprocess.run(["git", "add", "pyproject.toml"], cwd=swe.path, check=True)
    commit = ["git", "-c", "user.name=x", "-c", "user.email=x@x", "commit", "-qm", "pyproject"]
    subprocess.run(commit, cwd=swe.path, check=True)
    base = _bash("git rev-parse HEAD", swe.path).stdout.strip()
    (swe.path / "pyproject.toml").write_text(table + "k20 = 20\n")
    assert _bash(diff_script(".", base, tmp_path / "out", LIMIT), swe.path).returncode == 0
    whole = (tmp_path / "out" / "pyproject.diff").read_text()
    assert " [tool.pytest.ini_options]\n" in whole and "+k20 = 20\n" in whole
    assert "[tool.pytest" not in (tmp_path / "out" / "model.patch").read_text()  # 3 lines of context there


def test_the_diff_fails_without_the_base_commit(swe: SweRepo, tmp_path: Path) -> None:
    assert _bash(diff_script(".", "0" * 40, tmp_path / "out", LIMIT), swe.path).returncode != 0


def test_apply_tries_swebench_commands_in_turn(swe: SweRepo, tmp_path: Path) -> None:
    script = apply_script(".", tmp_path / "model.patch")
    order = [script.index(command) for command in ("git apply --verbose ", "--3way", "--reject", "patch --batch")]
    assert order == sorted(order) and script.count("git reset -q --hard") == 3

    (tmp_path / "model.patch").write_text(swe.diff_for(FIXED))
    applied = _bash(script, swe.path)
    assert applied.returncode == 0 and ">>>>> Applied Patch: git apply --verbose" in applied.stdout
    _bash("git -c user.name=x -c user.email=x@x commit -qam fix", swe.path)
    again = _bash(script, swe.path)  # already in HEAD: plain `git apply` fails, the 3-way merge finds nothing to do
    assert again.returncode == 0 and ">>>>> Applied Patch: git apply --verbose --3way" in again.stdout


def test_apply_says_when_nothing_works_or_there_is_no_repository(swe: SweRepo, tmp_path: Path) -> None:
    (tmp_path / "model.patch").write_text(swe.diff_for(FIXED).replace("return a + b", "return a - b"))
    failed = _bash(apply_script(".", tmp_path / "model.patch"), swe.path)
    assert failed.returncode == 1 and ">>>>> Patch Apply Failed" in failed.stdout
    assert _bash(apply_script(str(tmp_path), tmp_path / "model.patch"), swe.path).returncode == NO_REPOSITORY_EXIT


def test_the_eval_script_resets_applies_and_runs_the_test_files(swe: SweRepo) -> None:
    lines = eval_lines(_instance(swe), "/testbed", None, Path("/s/test.patch"))
    base = swe.base_commit
    assert lines[0] == "cd /testbed || exit 1"
    assert lines[1] == (
        f"if git cat-file -e {base}:tests/test_calc.py 2>/dev/null; "
        f"then git checkout -q {base} -- tests/test_calc.py; else rm -f -- tests/test_calc.py; fi"
    )
    assert lines[3].startswith("git apply --verbose /s/test.patch || ")
    start = lines.index("echo '>>>>> Start Test Output'")
    assert lines[start + 1] == "pytest -rA tests/test_calc.py tests/test_table.py"
    # swebench's record_test_exit_code: the test command's status, kept out of the parsed region
    assert lines[start + 2 : start + 5] == [
        "SWEBENCH_TEST_EXIT_CODE=$?",
        "echo '>>>>> End Test Output'",
        'echo ">>>>> Test Exit Code: $SWEBENCH_TEST_EXIT_CODE"',
    ]
    assert lines[-2:] == lines[1:3]


def test_only_test_files_are_handed_to_the_test_command(swe: SweRepo) -> None:
    data = "diff --git a/tests/data.json b/tests/data.json\nnew file mode 100644\n"
    lines = eval_lines(_instance(swe, test_patch=swe.instance["test_patch"] + data), ".", "tox -e", Path("t"))
    assert "tox -e tests/test_calc.py tests/test_table.py" in lines
    assert any("rm -f -- tests/data.json" in line for line in lines)


def test_a_row_with_an_eval_script_runs_it_unless_a_test_cmd_is_given(swe: SweRepo) -> None:
    own = "#!/bin/bash\nset -uxo pipefail\ncd /testbed\n: '>>>>> Start Test Output'\npytest -rA\n"
    own += ": '>>>>> End Test Output'"
    instance = _instance(swe, eval_script=own)
    assert eval_lines(instance, ".", None, Path("t")) == [
        "cd /testbed",
        ": '>>>>> Start Test Output'",
        "pytest -rA",
        "SWEBENCH_TEST_EXIT_CODE=$?",
        ": '>>>>> End Test Output'",
        'echo ">>>>> Test Exit Code: $SWEBENCH_TEST_EXIT_CODE"',
    ]
    assert "pytest -x tests/test_calc.py tests/test_table.py" in eval_lines(instance, ".", "pytest -x", Path("t"))


def test_the_test_spec_chooses_parser_and_eval_type(swe: SweRepo) -> None:
    spec = spec_for(_instance(swe), None, ["true"])
    assert (spec.log_parser, spec.eval_type, spec.FAIL_TO_PASS) == ("parse_log_pytest", "pass_and_fail", F2P)
    assert spec.eval_script == "#!/bin/bash\nset -uxo pipefail\ntrue\n"
    assert spec_for(_instance(swe, repo="eslint/eslint"), None, []).eval_type == "fail_only"
    row = _instance(swe, repo="eslint/eslint", eval_type="pass_and_fail", log_parser="parse_log_pytest_v2")
    assert (spec_for(row, None, []).eval_type, spec_for(row, None, []).log_parser) == (
        "pass_and_fail",
        "parse_log_pytest_v2",
    )
    assert spec_for(row, "parse_log_django", []).log_parser == "parse_log_django"


def _log(*body: str, exit_code: int = 0) -> str:
    lines = ["+ echo '>>>>> Start Test Output'", ">>>>> Start Test Output", *body, ">>>>> End Test Output"]
    return "\n".join([*lines, f">>>>> Test Exit Code: {exit_code}"]) + "\n"


def test_grading_passes_everything_listed(swe: SweRepo) -> None:
    log = _log(*(f"PASSED {name}" for name in [*P2P, *F2P]), "caf\u00e9 \ufffd: non-ASCII output is fine")
    report = grade(spec_for(_instance(swe), None, []), log, applied=True)
    assert (report["resolved"], report["resolution_status"], report["test_exit_code"]) == (True, "RESOLVED_FULL", 0)
    assert report["tests_status"]["FAIL_TO_PASS"] == {"success": F2P, "failure": []}
    # Tests passing without an applied patch (the empty patch's run on the base) resolve nothing.
    assert grade(spec_for(_instance(swe), None, []), log, applied=False)["resolution_status"] == "RESOLVED_NO"


def test_grading_output_without_results_or_without_a_run(swe: SweRepo) -> None:
    spec = spec_for(_instance(swe), None, [])
    for log in ("the test patch did not apply\n", _log("FAILED tests/test_calc.py::test_add", exit_code=0)[:60], None):
        report = grade(spec, log, applied=True)
        assert (report["resolved"], report["resolution_status"], report["test_results"]) == (False, "RESOLVED_NO", {})
        assert report["tests_status"]["FAIL_TO_PASS"]["failure"] == F2P
        assert report["tests_status"]["PASS_TO_PASS"]["failure"] == P2P
    assert grade(spec, None, applied=True)["test_exit_code"] is None


def test_small_helpers() -> None:
    assert reached_tests("+ echo '>>>>> Start Test Output'\n>>>>> Start Test Output\n")
    assert not reached_tests("the test patch did not apply")
    assert known_parser("parse_log_pytest") and not known_parser("parse_log_nope")
