"""Where session directories live: never inside a project. A command in a session (the harness, a prepare step,
an evaluator's tests) looks upward for configuration the way tools do — pytest for ``pyproject.toml`` /
``pytest.ini`` / ``setup.cfg``, git for ``.git``, pyenv for ``.python-version``, npm for ``package.json`` — and
must find none of the host's: with sessions under the checkout Polar was started from, a task's own tests ran with
Polar's pytest settings (``--import-mode=importlib``) and could not import a module next to them.

So by default the work root is a directory of this deployment's own under the system's temporary directory
(``/tmp/polar-<deployment>/sessions``, ``polar.config.default_work_root``), and a worker warns when
``POLAR_WORK_ROOT`` is inside a project. Commands
also get ``GIT_CEILING_DIRECTORIES`` at the work root, so git never walks above a session.
"""

from __future__ import annotations

from pathlib import Path

# Files and directories by which tools recognise a project (and read its configuration) in a parent directory.
PROJECT_MARKERS = (
    "pyproject.toml", "setup.cfg", "setup.py", "pytest.ini", "tox.ini", "conftest.py", ".git", ".hg",
    "package.json", ".python-version", ".tool-versions", ".npmrc",
)  # fmt: skip


def project_above(work_root: Path) -> tuple[Path, str] | None:
    """The nearest directory at or above ``work_root`` that holds a project marker, and the marker; None when
    sessions under it would see no project's configuration."""
    for directory in [work_root, *work_root.parents]:
        for marker in PROJECT_MARKERS:
            if (directory / marker).exists():
                return directory, marker
    return None
