"""Lease tokens: two holders of one session on one node (same worker name: threads of one worker) are told
apart, so the stale one changes nothing; and judgments on the database's clock, so a worker whose clock is off by
minutes loses no lease, and the reconciler changes a run's state before it touches its harness."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

import polar.clock
from polar.contract.dispatch import Stage
from polar.services import Services
from polar.stages import lease
from polar.stages import reconciler as reconciler_module
from polar.stages.init import init_session
from polar.stages.postrun import postrun_session
from polar.stages.reconciler import reconcile
from polar.stages.run import _start, run_session
from polar.storage.models import Session, SessionEvent
from tests.processes import process_alive, session_dirs
from tests.stage_calls import command_task, deliver_all, domain_services, submit_tasks

HANG_GUARD_S = 60  # waits and joins below are hang guards for a loaded machine, not speed claims


@pytest.fixture
def services(database_url: str, tmp_path: Path) -> Services:
    # A long heartbeat interval and a stale window far longer than any step here takes on a loaded machine: a
    # holder's lease goes stale only when the test says so (``stale``: its last heartbeat an hour ago).
    return domain_services(
        database_url, tmp_path / "work", stale_after_s=60.0, heartbeat_interval_s=600.0, plugin_modules=("tests.e2e",)
    )


def only(services: Services) -> Session:
    with services.db.unit() as db:
        (session,) = db.scalars(sa.select(Session)).all()
        return session


def stale(services: Services) -> None:
    """The current holder stopped heartbeating long ago (it stalled: a GC pause, a frozen VM, a stopped process)."""
    with services.db.unit() as db:
        db.execute(sa.update(Session).values(heartbeat_at=sa.func.now() - sa.text("interval '1 hour'")))


def wait_for(path: Path, timeout_s: float = HANG_GUARD_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def events(services: Services, to_state: str) -> int:
    with services.db.unit() as db:
        return int(db.scalar(sa.select(sa.func.count()).where(SessionEvent.to_state == to_state)) or 0)


def test_a_stale_init_changes_nothing_and_keeps_out_of_the_new_ones_directory(
    services: Services, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    gate.mkdir()
    # Claim n records itself, then waits for go-n before it finishes.
    step = (f'n=$(( $(cat {gate}/claims 2>/dev/null || echo 0) + 1 )); echo $n > {gate}/claims; '
            f'echo claim-$n > mine.txt; while [ ! -e {gate}/go-$n ]; do sleep 0.05; done')  # fmt: skip
    submit_tasks(services, command_task("t", "true", runtime={"prepare": [{"run": step}]}))
    session_id = only(services).id
    first = threading.Thread(target=init_session, args=(services, session_id))
    first.start()
    wait_for(gate / "claims")
    stale(services)  # the first init stalls; the reconciler re-sends init and a second claim takes it
    second = threading.Thread(target=init_session, args=(services, session_id))
    second.start()
    deadline = time.monotonic() + HANG_GUARD_S
    while (gate / "claims").read_text().strip() != "2":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    (gate / "go-1").touch()  # the stale one finishes first
    first.join(HANG_GUARD_S)
    assert only(services).state == "init"  # it changed nothing
    (gate / "go-2").touch()
    second.join(HANG_GUARD_S)

    session = only(services)
    assert session.state == "ready" and events(services, "ready") == 1
    kept = session_dirs(services.config.work_root, session_id)
    assert kept == [Path(session.runtime_handle["root"])]  # the stale claim's own directory is gone
    assert (kept[0] / "work" / "mine.txt").read_text() == "claim-2\n"


def test_a_stale_postrun_changes_nothing(services: Services, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    gate.mkdir()
    evaluator = {"name": "tests.e2e.evaluator_plugins.gated:Gated", "config": {"dir": str(gate)}}
    submit_tasks(services, command_task("t", "true", evaluator=evaluator))
    deliver_all(services, until=lambda stage, _: stage is Stage.POSTRUN)
    session_id = only(services).id
    first = threading.Thread(target=postrun_session, args=(services, session_id))
    first.start()
    wait_for(gate / "calls")
    stale(services)
    second = threading.Thread(target=postrun_session, args=(services, session_id))
    second.start()
    deadline = time.monotonic() + HANG_GUARD_S
    while (gate / "calls").read_text() != "2":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    (gate / "go-1").touch()  # the stale postrun finishes first: its result must not be the session's
    first.join(HANG_GUARD_S)
    assert only(services).state == "postrun"
    (gate / "go-2").touch()
    second.join(HANG_GUARD_S)
    session = only(services)
    assert (session.state, session.reward, session.evaluation) == ("completed", 2.0, {"call": 2})
    assert events(services, "completed") == 1


@contextmanager
def clock_behind(minutes: float) -> Iterator[None]:
    """This process's clock is ``minutes`` behind (the worker's machine drifted)."""
    real = polar.clock.utcnow
    skewed = lambda: real() - timedelta(minutes=minutes)  # noqa: E731
    patched = [(m, m.utcnow) for m in list(sys.modules.values()) if getattr(m, "utcnow", None) is real]
    for module, _ in patched:
        module.utcnow = skewed
    try:
        yield
    finally:
        for module, original in patched:
            module.utcnow = original


def test_a_worker_clock_minutes_off_loses_no_lease(services: Services) -> None:
    submit_tasks(services, command_task("t", "true", samples=2))
    deliver_all(services, until=lambda stage, _: stage is Stage.RUN)
    preparing, starting = (s.id for s in _all(services))
    with services.db.unit() as db:  # one session back in init, its message sent long ago (init takes a while)
        db.execute(
            sa.update(Session)
            .where(Session.id == preparing)
            .values(state="init", stage_enqueued_at=sa.func.now() - sa.text("interval '5 minutes'"))
        )
    with clock_behind(minutes=10):  # this worker's machine: claims, starts runs and heartbeats on its own clock
        claimed = lease.claim(services, preparing, lease.State.INIT)
        assert claimed is not None
        run_lease = _start(services, starting, "key")
        assert run_lease is not None
        assert lease._beat(services, starting, run_lease) == (True, False)
    done = reconcile(services)  # another machine's reconciler, on the right clock, finds both leases alive
    assert (done["resent_init"], done["lost_runs"]) == (0, 0)
    assert {s.id: s.lease for s in _all(services)} == {preparing: claimed.lease, starting: run_lease}


def _all(services: Services) -> list[Session]:
    with services.db.unit() as db:
        return list(db.scalars(sa.select(Session).order_by(Session.sample_index)))


def test_the_reconciler_judges_before_it_kills(services: Services, monkeypatch: pytest.MonkeyPatch) -> None:
    submit_tasks(services, command_task("t", "sleep 60"))
    deliver_all(services, until=lambda stage, _: stage is Stage.RUN)
    session_id = only(services).id
    run = threading.Thread(target=run_session, args=(services, session_id), daemon=True)
    run.start()
    deadline = time.monotonic() + HANG_GUARD_S
    while not (only(services).runtime_handle or {}).get("pgids"):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    harness = only(services).runtime_handle["pgids"][0]
    stale(services)

    # The run's heartbeat lands between the reconciler's look at the table and its compare-and-set.
    original = reconciler_module.send_to_postrun

    def beat_first(*args: object, **kwargs: object) -> bool:
        with services.db.unit() as db:
            db.execute(sa.update(Session).where(Session.id == session_id).values(heartbeat_at=sa.func.now()))
        return original(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(reconciler_module, "send_to_postrun", beat_first)
    assert reconcile(services)["lost_runs"] == 0
    assert only(services).state == "running" and process_alive(harness)  # a healthy run is left alone
    assert lease._beat(services, session_id, uuid.uuid4()) == (False, False)  # only the holder's token beats
    os.killpg(harness, signal.SIGKILL)  # the harness ends; its own run worker hands the session on
    run.join(HANG_GUARD_S)
    assert only(services).state == "postrun"
