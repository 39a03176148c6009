"""A hostile bwrap sandbox cannot take the proxy or its run worker down: it opens 130 connections that trickle
bytes and 5,000 it holds idle, straight to its proxy socket; meanwhile another session's calls are answered, and
the run worker's threads stay within the sandbox's bound. ``bench/sandbox_flood.py`` prints the latencies."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from polar.config import load_config
from polar.runtimes.bounds import SandboxBounds
from tests.live_proxy import LiveProxy, live_proxy
from tests.sandbox_flood import flood

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="NO BWRAP: bubblewrap is not installed")

SLACK = 8  # threads of the harness's own (the runtime's exec and its output readers)


@pytest.fixture
def proxy(database_url: str, tmp_path: Path) -> Iterator[LiveProxy]:
    with live_proxy(database_url, tmp_path) as live:
        yield live


def test_a_flooding_sandbox_leaves_other_sessions_and_the_run_worker_alone(proxy: LiveProxy, tmp_path: Path) -> None:
    config = load_config({"POLAR_WORK_ROOT": str(tmp_path / "sessions")}, cwd=tmp_path)
    (_, attacker), (_, victim) = proxy.batch({}, {})
    figures = flood(proxy.url, attacker, victim, config, calls=10)
    print(figures.report())
    assert figures.opened == "130 5000"
    assert set(figures.statuses) == {200}
    assert figures.threads_peak <= figures.threads_before + SandboxBounds().threads() + SLACK
