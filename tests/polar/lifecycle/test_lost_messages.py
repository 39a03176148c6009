"""Telling a lost stage message from one waiting its turn, on hand-made session rows (node "a", 2 run slots), and
when the reconciler may judge leases at all."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

from polar.clock import utcnow
from polar.config import load_config
from polar.contract.dispatch import Stage
from polar.lifecycle.lost_messages import lost_messages
from polar.lifecycle.nodes import announce
from polar.services import Services
from polar.stages.reconciler import LeaseJudge
from polar.storage.models import Session
from tests.stage_calls import command_task, domain_services, submit_tasks

STALE_S = 30


@pytest.fixture
def services(database_url: str, tmp_path: Path) -> Services:
    services = domain_services(
        database_url, tmp_path, node="a", run_concurrency=2, ready_buffer=0, stale_after_s=STALE_S
    )
    announce(services)
    return services


def ago(seconds: float) -> datetime:
    return utcnow() - timedelta(seconds=seconds)


def sessions(services: Services, n: int) -> list[uuid.UUID]:
    submit_tasks(services, command_task("t", "true", samples=n))
    with services.db.unit() as db:
        return list(db.scalars(sa.select(Session.id).order_by(Session.sample_index)))


def put(services: Services, session_id: uuid.UUID, **values: object) -> None:
    with services.db.unit() as db:
        db.execute(sa.update(Session).where(Session.id == session_id).values(node="a", **values))


def resent(services: Services) -> set[tuple[Stage, uuid.UUID]]:
    now = utcnow()
    stale, requeue = now - timedelta(seconds=STALE_S), now - timedelta(seconds=300)
    with services.db.unit() as db:
        return set(lost_messages(db, sa.true(), stale, requeue, run_slots=2))  # type: ignore[arg-type]


def running(services: Services, session_id: uuid.UUID, started_s_ago: float) -> None:
    put(services, session_id, state="running", ready_at=ago(started_s_ago + 5), run_started_at=ago(started_s_ago),
        heartbeat_at=utcnow())  # fmt: skip


def test_a_ready_session_waiting_for_busy_run_slots_is_left_alone(services: Services) -> None:
    first, second, waiting = sessions(services, 3)
    running(services, first, 600)
    running(services, second, 600)
    put(services, waiting, state="ready", ready_at=ago(500), stage_enqueued_at=ago(500))  # long wait, slots busy
    assert resent(services) == set()


def test_a_ready_session_overtaken_by_a_later_one_lost_its_message(services: Services) -> None:
    lost, later, other = sessions(services, 3)
    put(services, lost, state="ready", ready_at=ago(200), stage_enqueued_at=ago(200))
    running(services, later, 100)  # became ready after `lost` was queued, and has been running a while
    running(services, other, 600)
    assert resent(services) == {(Stage.READY, lost)}


def test_an_overtaking_run_must_have_started_a_stale_window_ago(services: Services) -> None:
    waiting, later, other = sessions(services, 3)
    put(services, waiting, state="ready", ready_at=ago(200), stage_enqueued_at=ago(200))
    running(services, later, 5)  # a message taken a moment ago may be racing with ours
    running(services, other, 600)
    assert resent(services) == set()


def test_a_ready_session_with_an_idle_run_slot_lost_its_message(services: Services) -> None:
    busy, lost = sessions(services, 2)
    running(services, busy, 600)
    put(services, lost, state="ready", ready_at=ago(60), stage_enqueued_at=ago(60))
    assert resent(services) == {(Stage.READY, lost)}


def test_a_just_queued_ready_session_is_left_alone(services: Services) -> None:
    (fresh,) = sessions(services, 1)
    put(services, fresh, state="ready", ready_at=ago(1), stage_enqueued_at=ago(1))
    assert resent(services) == set()


def test_postrun_overtaken_or_after_requeue(services: Services) -> None:
    lost, later, waiting, stuck = sessions(services, 4)
    put(services, lost, state="postrun", postrun_started_at=ago(200), stage_enqueued_at=ago(200))
    put(services, later, state="completed", postrun_started_at=ago(150), finished_at=ago(100))
    put(services, waiting, state="postrun", postrun_started_at=ago(60), stage_enqueued_at=ago(60))
    put(services, stuck, state="postrun", postrun_started_at=ago(400), stage_enqueued_at=ago(400))
    assert resent(services) == {(Stage.POSTRUN, lost), (Stage.POSTRUN, stuck)}


def test_stale_leases_and_unclaimed_init(services: Services) -> None:
    died, queued, fresh = sessions(services, 3)
    put(services, died, state="init", heartbeat_at=ago(100), stage_enqueued_at=ago(100))
    put(services, queued, state="init", stage_enqueued_at=ago(400))
    put(services, fresh, state="init", stage_enqueued_at=ago(60))
    assert resent(services) == {(Stage.INIT, died), (Stage.INIT, queued)}


def test_the_lease_judge_waits_a_stale_window_of_prompt_passes() -> None:
    now = [0.0]
    judge = LeaseJudge(stale_after_s=30.0, clock=lambda: now[0])
    for _ in range(6):  # prompt passes every 5 s: judging starts once 30 s of them are behind
        judge.observe(prompt=True)
        assert not judge.may_judge
        now[0] += 5.0
    judge.observe(prompt=True)
    assert judge.may_judge
    judge.observe(prompt=False)  # a slow pass (the database froze mid-pass): a stale window of watching again
    assert not judge.may_judge
    now[0] += 5.0
    judge.observe(prompt=True)
    now[0] += 40.0  # the process itself was stopped for 40 s: that gap is no evidence either
    judge.observe(prompt=True)
    assert not judge.may_judge
    for _ in range(7):
        now[0] += 5.0
        judge.observe(prompt=True)
    assert judge.may_judge


@pytest.mark.parametrize("stale_after", ["30", "4", "1"])
def test_a_workers_reconciler_ticks_often_enough_for_its_lease_judge(stale_after: str) -> None:
    """A short POLAR_STALE_AFTER beside the default 5 s interval (a test noticing a killed worker in seconds):
    ticking every 5 s, the judge saw no two passes close enough together and judged leases only by accident (on a
    new process's second pass), so a killed run worker's sessions could stay running for good. The worker ticks at
    ``reconcile_tick_s``: past the first stale window, every pass may judge."""
    config = load_config({"POLAR_STALE_AFTER": stale_after, "POLAR_RECONCILE_INTERVAL": "5"}, Path("/"))
    assert config.reconcile_tick_s == min(5.0, config.stale_after_s / 4)
    now = [0.0]
    judge = LeaseJudge(config.stale_after_s, clock=lambda: now[0])
    judged = []
    for _ in range(int(10 * config.stale_after_s / config.reconcile_tick_s)):  # as workers.reconciler's loop
        now[0] += config.reconcile_tick_s
        judged.append(judge.may_judge)
        judge.observe(prompt=True)
    warm = int(config.stale_after_s / config.reconcile_tick_s) + 1
    assert all(judged[warm:]) and not any(judged[: warm - 1]), judged
