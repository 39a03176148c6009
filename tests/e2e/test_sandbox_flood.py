"""A hostile bwrap sandbox cannot take the proxy or its run worker down: it opens 130 connections that trickle
bytes and 5,000 it holds idle, straight to its proxy socket; meanwhile another session's calls are answered, and
the run worker's threads stay within the sandbox's bound. ``bench/sandbox_flood.py`` prints the latencies.
And one flooding made-up keys is refused by its relay, leaving a new session's calls alone."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from polar.config import load_config
from polar.runtimes.bounds import SandboxBounds
from tests.live_proxy import LiveProxy, live_proxy
from tests.sandbox_flood import flood, key_flood

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


def test_a_sandbox_flooding_made_up_keys_leaves_a_new_sessions_calls_alone(proxy: LiveProxy, tmp_path: Path) -> None:
    """G4: 1,000 made-up keys a second from one sandbox are refused by its relay (401), never looked up by the
    proxy; a session whose first call comes in the middle of it has every call answered."""
    config = load_config({"POLAR_WORK_ROOT": str(tmp_path / "sessions")}, cwd=tmp_path)
    (_, attacker), (_, victim) = proxy.batch({}, {})
    unauthorized_before = _answered(proxy, "401")
    flood_statuses, victim_statuses = key_flood(proxy.url, attacker, victim, config)
    print(f"flood: {flood_statuses}; the new session's calls: {victim_statuses}")
    refused = flood_statuses.get("401", 0)
    assert refused >= 2000 and set(flood_statuses) <= {"401", "503"}  # at the relay (503: over its connections)
    assert victim_statuses and set(victim_statuses) == {200}
    assert _answered(proxy, "401") == unauthorized_before  # none of them reached the proxy


def _answered(proxy: LiveProxy, status: str) -> float:
    """The proxy's count of answers with ``status`` (all workers: its /metrics)."""
    total = 0.0
    for line in httpx.get(f"{proxy.url}/metrics", timeout=30).text.splitlines():
        if line.startswith("polar_proxy_requests_total{") and f'status="{status}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total
