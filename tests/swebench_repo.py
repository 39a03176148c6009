"""A tiny SWE-bench-format instance built with git in a temporary folder (the official instance images cannot be
pulled here), shaped the way SWE-bench makes its rows: a repository whose history holds the issue's base commit
and, on top, the upstream fix; ``patch`` and ``test_patch`` are that fix's diff split into source and tests.

The bug: ``calc.mul`` adds. ``tests/test_calc.py::test_add`` passes before and after (PASS_TO_PASS); the fix
adds ``test_mul`` there and a new ``tests/test_table.py`` (both FAIL_TO_PASS).
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

INSTANCE_ID = "polar__calc-1"
# Contents of calc.py the tests (and the e2e policy) write; no double quotes, so a "Create FILE containing
# \"CONTENT\"" instruction can carry them.
BUGGY = "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a + b\n"
FIXED = "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a * b\n"
# Fixes test_mul only: FAIL_TO_PASS half passes (RESOLVED_PARTIAL).
PARTIAL = "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return 6 if (a, b) == (2, 3) else a + b\n"
# Fixes mul but breaks add: FAIL_TO_PASS passes, PASS_TO_PASS fails (RESOLVED_NO).
BREAKS_ADD = "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n"
WRONG = "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a ** b\n"

_TEST_CALC = "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"
_TEST_MUL = "\n\ndef test_mul():\n    assert mul(2, 3) == 6\n"
_TEST_TABLE = "from calc import mul\n\n\ndef test_table():\n    assert [mul(i, 3) for i in range(4)] == [0, 3, 6, 9]\n"
# The venv's pytest, reachable in the docker runtime too (it bind-mounts the venv at its host path).
TEST_CMD = f"{sys.executable} -m pytest -rA -p no:cacheprovider"


@dataclass(frozen=True)
class SweRepo:
    """The repository on the host and the SWE-bench row describing its issue."""

    path: Path
    base_commit: str
    instance: dict[str, Any]

    def diff_for(self, content: str) -> str:
        """The unified diff (from base_commit) that turns calc.py into ``content``."""
        calc = self.path / "calc.py"
        calc.write_text(content)
        try:
            return _git(self.path, "diff", self.base_commit, "--", "calc.py")
        finally:
            _git(self.path, "checkout", "-q", self.base_commit, "--", "calc.py")

    def prepare_steps(self) -> list[dict[str, Any]]:
        """Runtime prepare steps: the repository copied into the work directory, checked out at base_commit."""
        return [{"copy": str(self.path), "to": "."}, {"run": f"git checkout -q --detach {self.base_commit}"}]


def _git(repo: Path, *args: str) -> str:
    command = ["git", "-c", "user.name=polar", "-c", "user.email=polar@example.com", *args]
    return subprocess.run(command, cwd=repo, check=True, capture_output=True, text=True).stdout


def _commit(repo: Path, files: dict[str, str], message: str) -> str:
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", message)
    return _git(repo, "rev-parse", "HEAD").strip()


# A test helper module next to the tests (no ``tests/__init__.py``): pytest's default import mode puts the test's
# directory on sys.path, so the tests import it by its bare name, as many repositories do.
_HELPERS = "TWO, THREE = 2, 3\n"
_TEST_CALC_NEIGHBOUR = (
    "from calc import add\nfrom helpers import THREE, TWO\n\n\ndef test_add():\n    assert add(TWO, THREE) == 5\n"
)


def build_swe_repo(root: Path, neighbour_module: bool = False) -> SweRepo:
    """The repository under ``root/calc`` (checked out at base_commit) and its instance row, in the HF datasets'
    shape (FAIL_TO_PASS and PASS_TO_PASS as JSON strings). ``neighbour_module``: its tests are not a package and
    import ``helpers`` from their own directory."""
    repo = root / "calc"
    repo.mkdir(parents=True)
    _git(repo, "init", "-q", "-b", "main")
    base = {".gitignore": "__pycache__/\n", "calc.py": BUGGY}
    if neighbour_module:
        base |= {"tests/helpers.py": _HELPERS, "tests/test_calc.py": _TEST_CALC_NEIGHBOUR}
    else:
        base |= {"tests/__init__.py": "", "tests/test_calc.py": _TEST_CALC}
    base_commit = _commit(repo, base, "calc: add and mul")
    test_calc = base["tests/test_calc.py"].replace("import add", "import add, mul") + _TEST_MUL
    fix_commit = _commit(
        repo, {"calc.py": FIXED, "tests/test_calc.py": test_calc, "tests/test_table.py": _TEST_TABLE}, "fix mul"
    )
    patch = _git(repo, "diff", base_commit, fix_commit, "--", "calc.py")
    test_patch = _git(repo, "diff", base_commit, fix_commit, "--", "tests")
    _git(repo, "checkout", "-q", "--detach", base_commit)
    instance = {
        "instance_id": INSTANCE_ID,
        "repo": "polar/calc",
        "base_commit": base_commit,
        "patch": patch,
        "test_patch": test_patch,
        "problem_statement": "calc.mul(2, 3) returns 5; it should multiply.",
        "hints_text": "",
        "created_at": "2025-01-01T00:00:00Z",
        "version": "0.1",
        "FAIL_TO_PASS": json.dumps(["tests/test_calc.py::test_mul", "tests/test_table.py::test_table"]),
        "PASS_TO_PASS": json.dumps(["tests/test_calc.py::test_add"]),
        "environment_setup_commit": base_commit,
    }
    return SweRepo(repo, base_commit, instance)
