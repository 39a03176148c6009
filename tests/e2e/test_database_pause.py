"""The database away for longer than the stale window while a healthy run is going kills nothing: when it comes
back, the reconciler's first passes would find every heartbeat stale before the runs' next beats land. Heartbeats
that could not be written are no evidence, so the reconciler judges leases only after a stale window of prompt
passes (``LeaseJudge``). Both ways away: stopped and restarted (connections refused), and frozen (SIGSTOP, every
query hangs, as on a stalled VM)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from polar.storage.migration import upgrade
from tests.private_services import PrivatePostgres
from tests.processes import wait_until
from tests.stacks import running_stack
from tests.stage_calls import command_task

pytestmark = pytest.mark.long(seconds=58)  # dealt out first, longest first (tests/conftest.py)


# Away for longer than the stale window (3 s below), so every heartbeat is stale when the database is back; the
# harness outlasts the time away by as much again as the stale window and more, so the run is still going when the
# reconciler's first passes come.
AWAY_S = 5
HARNESS_S = 12


@pytest.fixture
def postgres() -> Iterator[PrivatePostgres]:
    server = PrivatePostgres()
    server.start()
    yield server
    server.close()


def _restart(postgres: PrivatePostgres) -> None:
    postgres.stop("fast")
    time.sleep(AWAY_S)
    postgres.start()


def _freeze(postgres: PrivatePostgres) -> None:
    postgres.pause()
    time.sleep(AWAY_S)
    postgres.resume()


@pytest.mark.parametrize("away", [_restart, _freeze], ids=["restarted", "frozen"])
def test_a_database_away_kills_no_healthy_run(
    away: object, postgres: PrivatePostgres, broker_url: str, tmp_path: Path
) -> None:
    database_url = postgres.create_database("polar")
    upgrade(database_url)
    # Stale after 3 s; a beat every 2 s, so when the database is back the next beat may be up to 2 s away.
    env = {"POLAR_STALE_AFTER": "3", "POLAR_HEARTBEAT_INTERVAL": "2", "POLAR_RECONCILE_INTERVAL": "0.5"}
    with running_stack(database_url, broker_url, tmp_path, run_concurrency=1, env=env, supervise=True) as stack:
        submitted = stack.client.submit({"tasks": [command_task("healthy", f"sleep {HARNESS_S}")]})
        wait_until(lambda: stack.sql("SELECT 1 FROM sessions WHERE state = 'running'"), message="the run to start")
        time.sleep(1)
        away(postgres)  # type: ignore[operator]
        final = stack.wait(submitted["batch_id"], timeout_s=300)
        (row,) = stack.sql("SELECT state, outcome, outcome_class, attempt FROM sessions")
        assert final["counts"] == {"completed": 1}
        # Not worker_lost, not retried (a harness that asks no model: excluded, not the infrastructure's).
        assert tuple(row) == ("completed", "exited", "excluded", 1)
