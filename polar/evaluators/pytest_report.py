"""The test statuses of a judging command's pytest run, from the report Polar's pytest plugin writes
(``polar.evaluators.pytest_report_plugin``), never from what the command prints: the judged code shares that
output and can print any line it likes.

``prepare`` writes the plugin into a folder of the session directory whose name the harness could not guess
(never through a link) and returns the environment that loads it into any pytest the command starts
(``PYTEST_ADDOPTS=-p _polar_pytest_report``, the folder first on ``PYTHONPATH``, the report directory). ``statuses``
reads the report back after the command, and refuses what the judged code could have forged:

- no report: pytest never reached its test run (the work broke its start-up, e.g. a ``conftest.py`` that
  raises) or the command ran no pytest: ``EvaluationError``;
- more than one file in the report directory (the plugin makes exactly one, after collection, under a random
  name), a report over ``REPORT_LIMIT_BYTES``, one that is no report or names a test twice: tampering,
  ``EvaluationError``.

Both are the work's failure (the task's ``failure_reward``). An expected test absent from a sound report (its
module failed to collect, it was deselected) is a mismatch, scored like any other status.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from polar.errors import EvaluationError
from polar.runtimes.session_files import FileTooLarge, chown_dir, list_dir, make_dirs, owner, read_bytes, write_file

TestStatus = Literal["PASSED", "SKIPPED", "XFAIL", "XPASS", "FAILED", "ERROR"]
STATUSES: tuple[str, ...] = ("PASSED", "SKIPPED", "XFAIL", "XPASS", "FAILED", "ERROR")
PLUGIN_MODULE = "_polar_pytest_report"
PLUGIN_OPTION = f"-p {PLUGIN_MODULE}"
REPORT_DIR_ENV = "POLAR_PYTEST_REPORT_DIR"
FOLDER = "polar-pytest"  # under the session directory: one folder per judging run
# A report holds a line per test: 32 MiB is well over a hundred thousand tests.
REPORT_LIMIT_BYTES = 32 * 1024 * 1024


def plugin_source() -> bytes:
    return resources.files("polar.evaluators").joinpath("pytest_report_plugin.py").read_bytes()


def prepare(session_dir: Path, task_env: Mapping[str, str]) -> tuple[str, dict[str, str]]:
    """Write the plugin for one run; returns its folder (relative to ``session_dir``) and the environment a
    judging command needs to load it (the task's own ``PYTEST_ADDOPTS`` and ``PYTHONPATH`` kept)."""
    folder = f"{FOLDER}/{uuid.uuid4().hex}"
    try:
        write_file(session_dir, f"{folder}/{PLUGIN_MODULE}.py", plugin_source(), mode=0o644)
        reports = make_dirs(session_dir, f"{folder}/reports")
        uid, gid = owner(session_dir, "work")
    except OSError as exc:  # the harness made polar-pytest a file, or a directory Polar cannot enter: its doing
        raise EvaluationError(f"cannot write the pytest report plugin under {FOLDER}/: {exc}") from exc
    with contextlib.suppress(PermissionError):  # only a root worker may hand it over; otherwise it is ours already
        chown_dir(session_dir, f"{folder}/reports", uid, gid)
    addopts = task_env.get("PYTEST_ADDOPTS")
    path = task_env.get("PYTHONPATH")
    plugin_dir = str(session_dir / folder)
    return folder, {
        "PYTEST_ADDOPTS": f"{addopts} {PLUGIN_OPTION}" if addopts else PLUGIN_OPTION,
        "PYTHONPATH": f"{plugin_dir}:{path}" if path else plugin_dir,
        REPORT_DIR_ENV: str(reports),
    }


def statuses(session_dir: Path, folder: str) -> tuple[dict[str, str], list[str]]:
    """Test id → status from the run's report, and the collectors (modules, classes) that failed to collect."""
    reports = f"{folder}/reports"
    try:
        names = list_dir(session_dir, reports)
    except OSError as exc:
        raise EvaluationError(f"cannot list the pytest report directory {reports}: {exc}") from exc
    if not names:
        raise EvaluationError(
            "no pytest report: pytest never reached its test run (its start-up failed, e.g. a conftest.py that "
            "raises) or the command ran no pytest"
        )
    if len(names) > 1:
        raise EvaluationError(
            f"{len(names)} files in the pytest report directory where pytest makes one, after collection: "
            "tampering (or the command ran pytest more than once)",
            {"reports": names[:20]},
        )
    shown = f"{reports}/{names[0]}"
    try:
        data = read_bytes(session_dir, shown, limit=REPORT_LIMIT_BYTES)
    except FileTooLarge as exc:
        raise EvaluationError(f"the pytest report holds {exc.size} bytes, over the limit of {exc.limit}") from exc
    except OSError as exc:
        raise EvaluationError(f"cannot read the pytest report {shown}: {exc}") from exc
    try:
        return _parse(json.loads(data))
    except EvaluationError:
        raise
    except Exception as exc:  # empty (pytest was killed before its end), nested past the parser's stack, ...
        raise EvaluationError(f"the pytest report is no report: {type(exc).__name__}: {exc}") from exc


def _parse(data: Any) -> tuple[dict[str, str], list[str]]:
    if not isinstance(data, dict) or not isinstance(data.get("tests"), list):
        raise ValueError("not an object with a list of tests")
    found: dict[str, str] = {}
    for entry in data["tests"]:
        if not (isinstance(entry, dict) and isinstance(entry.get("nodeid"), str) and entry.get("status") in STATUSES):
            raise ValueError(f"a test entry {str(entry)[:200]} is not a test id with a status")
        if entry["nodeid"] in found:
            raise EvaluationError(f"the pytest report names {entry['nodeid']!r} twice: tampering")
        found[entry["nodeid"]] = entry["status"]
    errors = data.get("collection_errors", [])
    if not isinstance(errors, list) or not all(isinstance(name, str) for name in errors):
        raise ValueError("collection_errors is not a list of collector ids")
    return found, errors
