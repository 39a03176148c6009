"""The SWE-bench side of the ``swebench`` evaluator: the shell scripts it runs (take the diff, apply it, the eval
script in the shape swebench's harness runs) and the grading, done by the swebench package itself.

Pure: strings and paths in, scripts and reports out; ``polar.evaluators.swebench`` runs the scripts in the
runtimes. This module imports swebench (an extra, and a second to import), so that one loads it only when a
swebench task is checked or evaluated.
"""

from __future__ import annotations

import re
import shlex
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from swebench.harness.constants import (  # type: ignore[import-untyped]
    APPLY_PATCH_FAIL,
    APPLY_PATCH_PASS,
    END_TEST_OUTPUT,
    FAIL_ONLY_REPOS,
    FAIL_TO_PASS,
    NON_TEST_EXTS,
    PASS_TO_PASS,
    START_TEST_OUTPUT,
    EvalType,
    ResolvedStatus,
)
from swebench.harness.grading import (  # type: ignore[import-untyped]
    get_eval_tests_report,
    get_logs_eval,
    get_resolution_status,
    parse_test_exit_code,
)
from swebench.harness.log_parsers import PARSER_REGISTRY  # type: ignore[import-untyped]
from swebench.harness.run_evaluation import GIT_APPLY_CMDS  # type: ignore[import-untyped]
from swebench.harness.utils import parse_eval_script, record_test_exit_code  # type: ignore[import-untyped]
from swebench.types import TestSpec  # type: ignore[import-untyped]

if TYPE_CHECKING:
    from polar.evaluators.swebench import SWEBenchInstance

DEFAULT_TEST_CMD = "pytest -rA"
DEFAULT_LOG_PARSER = "parse_log_pytest"
# The apply script's exit code when repo_dir holds no git repository (a setup error, not the harness's fault).
NO_REPOSITORY_EXIT = 97
# The diff script's exit code when the harness's changes are over the patch's size limit (the work's failure).
OVER_LIMIT_EXIT = 95
# Context lines of the pyproject.toml diff: the whole file, so each changed line's table can be told.
FULL_CONTEXT_LINES = 10_000_000
DIFF_HEADER = re.compile(r"^diff --git a/.* b/(.*)$", re.M)
_q = shlex.quote


def known_parser(name: str) -> bool:
    """Whether swebench has a log parser of that name."""
    return name in PARSER_REGISTRY


def diff_script(repo_dir: str, base_commit: str, folder: Path, max_bytes: int) -> str:
    """Write ``folder/model.patch``: everything under ``repo_dir`` that differs from ``base_commit``, new untracked
    files included and ignored ones not, and ``folder/pyproject.diff``, the same diff of ``pyproject.toml`` files
    with the whole file as context (so their changed lines' sections can be told). A scratch index keeps the
    harness's own index (and any conflict in it) out of the way; stderr is left to the log, so only the diff lands
    in the file.

    Bounded by ``max_bytes`` at each step, none of which reads a file to measure it: the files ``git add`` would
    copy into the object store (untracked ones, and tracked ones that differ from the harness's index by their
    stat: counted whole) are measured first; then the new content the diff would load (the blobs staged against
    ``base_commit``); the diff itself goes through ``head -c``. So a multi-GB file the harness left fills neither
    disk nor memory. Over the limit, the script writes why to ``folder/over`` (and ``folder/changed.sizes``: size
    and name of each file measured, largest last) and exits ``OVER_LIMIT_EXIT``."""
    q_folder, index, limit = _q(str(folder)), _q(str(folder / "diff.index")), max_bytes + 1
    diff = f"git -c core.quotepath=off diff --cached --no-color --no-ext-diff {_q(base_commit)}"
    over = f"{q_folder}/over; exit {OVER_LIMIT_EXIT}; fi"
    return f"""set -e; mkdir -p {q_folder}; cd {_q(repo_dir)}; rm -f {q_folder}/over
{{ git ls-files -z --others --exclude-standard; git diff-files -z --name-only; }} > {q_folder}/changed.list
xargs -0 -r stat -c '%s %n' -- < {q_folder}/changed.list 2>/dev/null | sort -n > {q_folder}/changed.sizes || true
total=$(awk '{{s += $1}} END {{printf "%d", s}}' {q_folder}/changed.sizes)
if [ "$total" -gt {max_bytes} ]; then echo "the new and changed files hold $total bytes" > {over}
export GIT_INDEX_FILE={index}; rm -f {index}
git read-tree {_q(base_commit)}
git add -A
staged=$({diff} --raw --no-renames -z | tr '\\0' '\\n' \\
  | awk '/^:[0-7]+ [0-7]+ [0-9a-f]+ [0-9a-f]+ [ACMTU]/ {{print $4}}' \\
  | git cat-file --batch-check='%(objecttype) %(objectsize)' | awk '$1 == "blob" {{s += $2}} END {{printf "%d", s}}')
if [ "$staged" -gt {max_bytes} ]; then echo "the changed files' new content holds $staged bytes" > {over}
{{ status=0; {diff} --binary || status=$?; echo "$status" > {q_folder}/diff.status; }} \\
  | head -c {limit} > {q_folder}/model.patch
if [ "$(wc -c < {q_folder}/model.patch)" -gt {max_bytes} ]; then echo "the diff is longer" > {over}
status=$(cat {q_folder}/diff.status); [ "$status" = 0 ] || exit "$status"
{diff} -U{FULL_CONTEXT_LINES} -- ':(glob)**/pyproject.toml' | head -c {limit} > {q_folder}/pyproject.diff
"""


def apply_script(repo_dir: str, patch: Path) -> str:
    """Apply ``patch`` with swebench's ``GIT_APPLY_CMDS`` in turn; exit 0 once one works (or the patch turns out
    to be applied already), 1 when none does, ``NO_REPOSITORY_EXIT`` without a repository."""
    lines = [f"cd {_q(repo_dir)} || exit {NO_REPOSITORY_EXIT}"]
    lines.append(f"git rev-parse -q --verify HEAD >/dev/null || exit {NO_REPOSITORY_EXIT}")
    for attempt, command in enumerate(GIT_APPLY_CMDS):
        # A failed attempt leaves partial changes (--reject) or unmerged paths (--3way) behind, which swebench's
        # `git checkout -- .` cannot reset; a hard reset to HEAD can.
        if attempt:
            lines.append("git reset -q --hard; git clean -fdq")
        lines.append(f"if {command} {_q(str(patch))}; then echo {_q(f'{APPLY_PATCH_PASS}: {command}')}; exit 0; fi")
    already = f"{APPLY_PATCH_PASS}: verified already applied"
    lines.append(f"if git apply --check --reverse {_q(str(patch))}; then echo {_q(already)}; exit 0; fi")
    lines.append(f"echo {_q(APPLY_PATCH_FAIL)}; exit 1")
    return "\n".join(lines) + "\n"


def eval_lines(instance: SWEBenchInstance, repo_dir: str, test_cmd: str | None, test_patch: Path) -> list[str]:
    """The eval script's commands (``TestSpec.eval_script`` adds the shebang and ``set -uxo pipefail``): the
    row's own ``eval_script`` when it has one and no ``test_cmd`` is given, else SWE-bench's shape: the files the
    test patch touches reset to base_commit (removed when it adds them), the test patch applied, ``test_cmd`` run
    on its test files between the output markers, the files reset again."""
    if test_cmd is None and instance.eval_script is not None:
        return list(record_test_exit_code(parse_eval_script(instance.eval_script)))
    files = list(dict.fromkeys(DIFF_HEADER.findall(instance.test_patch)))
    tests = [name for name in files if not any(name.endswith(ext) for ext in NON_TEST_EXTS)]
    base = _q(instance.base_commit)
    reset = [
        f"if git cat-file -e {_q(f'{instance.base_commit}:{name}')} 2>/dev/null; "
        f"then git checkout -q {base} -- {_q(name)}; else rm -f -- {_q(name)}; fi"
        for name in files
    ]
    lines = [
        f"cd {_q(repo_dir)} || exit 1",
        *reset,
        f"git apply --verbose {_q(str(test_patch))} || {{ echo 'the test patch did not apply'; exit 1; }}",
        f"echo {_q(START_TEST_OUTPUT)}",
        f"{test_cmd or DEFAULT_TEST_CMD} {' '.join(_q(name) for name in tests)}",
        f"echo {_q(END_TEST_OUTPUT)}",
        *reset,
    ]
    return list(record_test_exit_code(lines))


def spec_for(instance: SWEBenchInstance, log_parser: str | None, lines: list[str]) -> Any:
    """swebench's ``TestSpec`` for the instance (what its grading reads: the tests, log parser, eval type)."""
    fail_only = instance.repo in FAIL_ONLY_REPOS
    default_type = EvalType.FAIL_ONLY if fail_only else EvalType.PASS_AND_FAIL
    return TestSpec(
        instance_id=instance.instance_id,
        image=str((instance.model_extra or {}).get("image") or ""),
        eval_script_list=lines,
        repo=instance.repo,
        version=instance.version,
        FAIL_TO_PASS=list(instance.FAIL_TO_PASS),
        PASS_TO_PASS=list(instance.PASS_TO_PASS),
        log_parser=log_parser or instance.log_parser or DEFAULT_LOG_PARSER,
        eval_type=instance.eval_type or default_type.value,
    )


def reached_tests(output: str) -> bool:
    """Whether the eval script got as far as running the tests."""
    return START_TEST_OUTPUT in output


def grade(spec: Any, log: str | None, applied: bool) -> dict[str, Any]:
    """swebench's verdict on the eval script's output (None: the tests never ran, so every listed test counts as
    failing). Only an applied patch can resolve the instance."""
    status_map: dict[str, str] = {}
    parsed = False
    if log is not None:
        # swebench reads a file in the locale's encoding; the output was decoded leniently already.
        with tempfile.NamedTemporaryFile("w", encoding="utf-8", suffix=".log") as copy:
            copy.write(log)
            copy.flush()
            status_map, parsed = get_logs_eval(spec, copy.name)
    gold = {FAIL_TO_PASS: spec.FAIL_TO_PASS, PASS_TO_PASS: spec.PASS_TO_PASS}
    tests_status = get_eval_tests_report(status_map, gold, eval_type=EvalType(spec.eval_type))
    status = get_resolution_status(tests_status) if applied and parsed else ResolvedStatus.NO.value
    return {
        "resolved": status == ResolvedStatus.FULL.value,
        "resolution_status": status,
        "tests_status": tests_status,
        "test_results": status_map,
        "test_exit_code": parse_test_exit_code(log) if log is not None else None,
    }
