"""Where session directories live: never inside a project. A command in a session (the harness, a prepare step,
an evaluator's tests) looks upward for configuration the way tools do — pytest for ``pyproject.toml`` /
``pytest.ini`` / ``setup.cfg``, git for ``.git``, pyenv for ``.python-version``, npm for ``package.json`` — and
must find none of the host's: with sessions under the checkout Polar was started from, a task's own tests ran with
Polar's pytest settings (``--import-mode=importlib``) and could not import a module next to them.

So by default the work root is a directory of this deployment's own under the system's temporary directory
(``/tmp/polar-<deployment>/sessions``, ``polar.config.default_work_root``), and a worker warns when
``POLAR_WORK_ROOT`` is inside a project. Commands
also get ``GIT_CEILING_DIRECTORIES`` at the work root, so git never walks above a session.

Nobody else may be able to swap what is in it (``ensure_work_root``, before every session directory is made, and
at a worker's start): under the shared ``/tmp`` another local user could make ``polar-<deployment>`` first and
then swap a session directory for a link, which the host's ``--bind`` and Docker's volumes follow. So each
directory and link on the way must be this user's or root's, and one others may write in must be sticky.
"""

from __future__ import annotations

import os
import stat
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


def swappable_part(work_root: Path) -> str | None:
    """Why another local user could swap or plant directories on the way to ``work_root`` (a directory or link
    on the way that is neither this user's nor root's, or a directory others may write in without the sticky
    bit); None when none can. Both the path as given and the one its links lead to are checked."""
    me = os.getuid()
    absolute = Path(os.path.abspath(work_root))
    for path in _on_the_way(absolute) + _on_the_way(absolute.resolve()):
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            break  # made by this user next
        if info.st_uid not in (0, me):
            return f"{path} belongs to uid {info.st_uid}, neither this user ({me}) nor root"
        writable_by_others = info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        if stat.S_ISDIR(info.st_mode) and writable_by_others and not info.st_mode & stat.S_ISVTX:
            return f"{path} is writable by other users (mode {stat.filemode(info.st_mode)}) without the sticky bit"
    return None


def ensure_work_root(work_root: Path) -> None:
    """Make ``work_root`` (and the directories on the way) if missing, then refuse it (PermissionError saying why)
    when another local user could swap what is in it: the default one is under the shared temporary directory,
    where anyone can make ``polar-<deployment>`` first."""
    work_root.mkdir(parents=True, exist_ok=True)
    problem = swappable_part(work_root)
    if problem is not None:
        raise PermissionError(
            f"refusing the work root {work_root}: {problem}, so another user could swap session directories; "
            "remove it or set POLAR_WORK_ROOT to a directory of this user's"
        )


def _on_the_way(path: Path) -> list[Path]:
    return [*reversed(path.parents), path]
