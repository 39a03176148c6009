"""The test-configuration files of a model patch: found at any depth, by name or (``pyproject.toml``) by the table a
changed line lies in, and dropped from the patch with ``revert``; real diffs made with git."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from polar.evaluators.swebench_patch import paths, pytest_lines_changed, screen, split

PYPROJECT = """\
[project]
name = "calc"
dependencies = ["attrs"]

[tool.black]
line-length = 100

[tool.pytest.ini_options]
addopts = "-q"
testpaths = ["tests"]
"""


def _git(repo: Path, *args: str) -> str:
    command = ["git", "-c", "user.name=x", "-c", "user.email=x@x", "-c", "core.quotepath=off", *args]
    return subprocess.run(command, cwd=repo, check=True, capture_output=True, text=True).stdout


def _diff(tmp_path: Path, before: dict[str, str], after: dict[str, str | None], *options: str) -> bytes:
    """The diff (``git diff`` of the working tree) that turns files ``before`` into ``after`` (None: removed)."""
    repo = tmp_path / "repo"
    repo.mkdir(parents=True, exist_ok=True)
    _git(repo, "init", "-q")
    for name, text in before.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "base", "--allow-empty")
    for name, text in after.items():
        if text is None:
            (repo / name).unlink()
        else:
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            (repo / name).write_text(text)
    _git(repo, "add", "-A")
    return _git(repo, "diff", "--cached", "--binary", *options, "HEAD").encode()


def test_configuration_files_are_found_at_any_depth_and_dropped(tmp_path: Path) -> None:
    after: dict[str, str | None] = {
        "calc.py": "def mul(a, b):\n    return a * b\n",
        "conftest.py": "import pytest\n",
        "tests/unit/conftest.py": "import pytest\n",
        "pytest.ini": "[pytest]\naddopts = -p no:x\n",
        ".pytest.ini": "[pytest]\n",
        "tox.ini": "[pytest]\n",
        "setup.cfg": "[tool:pytest]\n",
        "src/sitecustomize.py": "import os\n",
        "usercustomize.py": "import os\n",
        "venv/lib/site-packages/evil.pth": "import os\n",
        "docs/conftest.py.txt": "not a conftest\n",
    }
    patch = _diff(tmp_path, {"calc.py": "def mul(a, b):\n    return a + b\n"}, after)
    screened = screen(patch, None, revert=True)
    assert sorted(screened.flagged) == sorted(name for name in after if name not in ("calc.py", "docs/conftest.py.txt"))
    assert screened.reverted == screened.flagged
    kept = [paths(chunk) for chunk in split(screened.patch) if chunk]
    assert kept == [["calc.py"], ["docs/conftest.py.txt"]]
    assert b"return a * b" in screened.patch and b"import pytest" not in screened.patch

    kept_all = screen(patch, None, revert=False)
    assert kept_all.patch == patch and kept_all.flagged == screened.flagged and kept_all.reverted == []


def test_a_removed_or_renamed_conftest_is_found_and_kept_in_place(tmp_path: Path) -> None:
    before = {"tests/conftest.py": "import pytest\n" * 20, "calc.py": "x = 1\n"}
    removed = _diff(tmp_path / "a", before, {"tests/conftest.py": None, "calc.py": "x = 2\n"})
    assert screen(removed, None, revert=True).flagged == ["tests/conftest.py"]
    renamed = _diff(tmp_path / "b", before, {"tests/conftest.py": None, "tests/plugin.py": "import pytest\n" * 20})
    assert b"rename from tests/conftest.py" in renamed
    screened = screen(renamed, None, revert=True)
    assert screened.flagged == ["tests/conftest.py"] and screened.patch == b""


def test_quoted_and_spaced_paths_are_read(tmp_path: Path) -> None:
    patch = _diff(tmp_path, {}, {'odd "dir"/conftest.py': "import pytest\n", "a b/c d.py": "x = 1\n"})
    screened = screen(patch, None, revert=True)
    assert screened.flagged == ['odd "dir"/conftest.py']
    assert [paths(chunk) for chunk in split(screened.patch) if chunk] == [["a b/c d.py"]]


@pytest.mark.parametrize(
    ("change", "counts"),
    [
        (('addopts = "-q"', 'addopts = "-p no:warnings"'), True),
        (('testpaths = ["tests"]\n', 'testpaths = ["tests"]\npython_files = ["*.py"]\n'), True),
        (("[tool.pytest.ini_options]", "[tool.pytest.ini_options]\n# moved"), True),
        (("line-length = 100", "line-length = 120"), False),
        (('dependencies = ["attrs"]', 'dependencies = ["attrs", "pytest"]'), False),
        (("[project]\n", 'tool.pytest.ini_options.addopts = "-x"\n[project]\n'), True),  # a dotted key at the top
    ],
)
def test_pyproject_counts_when_a_pytest_table_changes(tmp_path: Path, change: tuple[str, str], counts: bool) -> None:
    after = PYPROJECT.replace(*change)
    assert after != PYPROJECT
    patch = _diff(tmp_path / "short", {"pyproject.toml": PYPROJECT}, {"pyproject.toml": after})
    whole = _diff(tmp_path / "whole", {"pyproject.toml": PYPROJECT}, {"pyproject.toml": after}, "-U10000000")
    assert pytest_lines_changed(whole) is counts
    screened = screen(patch, whole, revert=True)
    assert (screened.flagged, screened.patch == b"") == ((["pyproject.toml"], True) if counts else ([], False))


def test_a_pyproject_it_cannot_tell_counts(tmp_path: Path) -> None:
    patch = _diff(tmp_path, {"pyproject.toml": PYPROJECT}, {"pyproject.toml": PYPROJECT + "[tool.x]\n"})
    assert screen(patch, None, revert=True).flagged == ["pyproject.toml"]
    assert screen(patch, b"", revert=False).flagged == ["pyproject.toml"]


def test_a_patch_without_configuration_is_unchanged(tmp_path: Path) -> None:
    patch = _diff(tmp_path, {"calc.py": "x = 1\n"}, {"calc.py": "x = 2\n", "new.bin": "\x00\x01binary"})
    screened = screen(patch, b"", revert=True)
    assert (screened.patch, screened.flagged, screened.reverted) == (patch, [], [])
    assert screen(b"", None, revert=True).patch == b""
