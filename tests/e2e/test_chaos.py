"""The chaos run (``tests/chaos.py``): 200 sessions over two nodes while Redis, Postgres and the engine restart,
a worker of every stage is SIGKILLed, and one whole node is killed and comes back. Nothing it must guarantee may
break: every session terminal, every answer a harness received in Postgres, no duplicate trajectories, every
sample ending with a task outcome, lost attempts nowhere in the feed or the exports, the lost node's directories
torn down when it returns. ``bench/chaos.py`` runs the same and prints the figures."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos import ChaosPlan, run_chaos

pytestmark = pytest.mark.long  # dealt to a test process first (tests/conftest.py)


# `make test` runs two test processes; sharing the two cores with another module's stack, the run takes longer
# than the suite's default 300 s bound (the guarantees it checks do not depend on speed).
@pytest.mark.timeout(900)
def test_faults_never_become_training_signal(tmp_path: Path) -> None:
    report = run_chaos(ChaosPlan(), tmp_path)
    figures = "\n".join(f"{name}: {value}" for name, value in report.figures())
    assert report.violations == [], figures
    assert report.sessions >= report.samples >= 200
    assert report.task_outcomes == report.samples and report.received > 0
    assert sum(report.retried.values()) > 0  # the faults did hit sessions, and they were retried
    assert len(report.faults) >= 9 and report.reaped_on_return
