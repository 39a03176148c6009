"""Polar's pytest plugin: the test statuses of a judging command's pytest run, in a report file of their own.

``test_on_output`` with ``reward_from: tests`` copies this file into the session (never importing it itself) as
``_polar_pytest_report.py`` and loads it into the command's pytest with ``-p _polar_pytest_report`` in
``PYTEST_ADDOPTS``; ``POLAR_PYTEST_REPORT_DIR`` names the directory for the report. It runs in the judged
environment, whatever Python 3 and pytest that has: the standard library and pytest's public hooks only.

- At import (before any conftest or test module) it takes the directory from the environment and removes its own
  traces there (that variable, its ``-p`` option), so a pytest the tests start does not report as well.
- After collection (``pytest_runtestloop``, first of its implementations, on the controller only under xdist) it
  creates the report with ``O_EXCL`` under a random name: a file the work's code made while it was being imported
  or collected is a second file, which Polar refuses.
- At the session's end it writes each test's status once (the worst of its setup, call and teardown, as pytest's
  terminal reports them: PASSED, FAILED, ERROR, SKIPPED, XFAIL, XPASS) and the collectors that failed.
"""

import json
import os
import secrets

import pytest

_DIR_ENV = "POLAR_PYTEST_REPORT_DIR"
_OPTION = "-p _polar_pytest_report"
_RANK = {"PASSED": 0, "SKIPPED": 1, "XFAIL": 2, "XPASS": 3, "FAILED": 4, "ERROR": 5}

_directory = os.environ.pop(_DIR_ENV, None)
_addopts = os.environ.get("PYTEST_ADDOPTS", "")
if _addopts == _OPTION:
    del os.environ["PYTEST_ADDOPTS"]
elif _addopts.endswith(" " + _OPTION):
    os.environ["PYTEST_ADDOPTS"] = _addopts[: -len(_OPTION) - 1]

_statuses = {}
_collection_errors = []
_report = [None]  # the report's descriptor once it is made


def _status(report):
    """What one setup, call or teardown report says of its test, or None when it says nothing."""
    expected_to_fail = hasattr(report, "wasxfail")
    if report.outcome == "skipped":
        return "XFAIL" if expected_to_fail else "SKIPPED"
    if report.when != "call":
        return "ERROR" if report.outcome == "failed" else None
    if report.outcome == "passed":
        return "XPASS" if expected_to_fail else "PASSED"
    return "FAILED" if report.outcome == "failed" else None  # a rerun plugin's "rerun" is not the last word


def pytest_runtest_logreport(report):
    status = _status(report)
    known = _statuses.get(report.nodeid)
    if status is not None and (known is None or _RANK[status] > _RANK[known]):
        _statuses[report.nodeid] = status


def pytest_collectreport(report):
    if report.failed:
        _collection_errors.append(report.nodeid)


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session):
    if _directory is None or _report[0] is not None or hasattr(session.config, "workerinput"):
        return None
    name = os.path.join(_directory, "report-" + secrets.token_hex(16) + ".json")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    _report[0] = os.open(name, flags, 0o600)
    return None


def pytest_sessionfinish(session, exitstatus):
    fd, _report[0] = _report[0], None
    if fd is None:
        return
    tests = [{"nodeid": nodeid, "status": status} for nodeid, status in _statuses.items()]
    data = {"tests": tests, "collection_errors": _collection_errors, "exitstatus": int(exitstatus)}
    with os.fdopen(fd, "w") as handle:
        json.dump(data, handle)
