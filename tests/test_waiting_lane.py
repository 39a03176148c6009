"""``--waiting-lane`` (tests/waiting_lane.py): a small suite run by real pytest-xdist test processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CONFTEST = """
import pytest
from tests.waiting_lane import WaitingLaneScheduling, add_ini

def pytest_addoption(parser):
    parser.addoption("--waiting-lane", action="store_true")
    add_ini(parser)

def pytest_xdist_make_scheduler(config, log):
    return WaitingLaneScheduling(config, log) if config.getoption("waiting_lane") else None
"""

MODULE = """
import os, pathlib
def test_{index}_a(): pathlib.Path({out!r}, "{name}.a").write_text(os.environ["PYTEST_XDIST_WORKER"])
def test_{index}_b(): pathlib.Path({out!r}, "{name}.b").write_text(os.environ["PYTEST_XDIST_WORKER"])
"""


def test_the_last_process_runs_only_the_waiting_modules(tmp_path: Path) -> None:
    suite, out = tmp_path / "suite", tmp_path / "out"
    suite.mkdir()
    out.mkdir()
    (suite / "conftest.py").write_text(CONFTEST)
    (suite / "pytest.ini").write_text("[pytest]\nwaiting_modules =\n    test_wait_1.py\n    test_wait_2.py\n")
    names = [f"test_busy_{index}" for index in range(6)] + ["test_wait_1", "test_wait_2"]
    for index, name in enumerate(names):
        (suite / f"{name}.py").write_text(MODULE.format(index=index, out=str(out), name=name))
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n3", "--dist=loadfile", "--waiting-lane"],
        cwd=suite,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=600,  # hang guard: three small pytest processes
    )
    assert run.returncode == 0, run.stdout + run.stderr
    ran_on = {path.name: path.read_text() for path in out.iterdir()}
    assert len(ran_on) == 2 * len(names), ran_on
    lane = {name for name, worker in ran_on.items() if worker == "gw2"}
    assert lane == {"test_wait_1.a", "test_wait_1.b", "test_wait_2.a", "test_wait_2.b"}, ran_on
    assert {ran_on[f"test_busy_{index}.a"] for index in range(6)} <= {"gw0", "gw1"}
