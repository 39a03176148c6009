"""The stage functions called directly, in order, against Postgres and the local runtime."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
import sqlalchemy as sa

from polar.contract.dispatch import Stage
from polar.proxy.keys import hash_key
from polar.proxy.refusals import DATABASE_OUTAGE, RefusalCounter, refusal_counts
from polar.services import Services
from polar.stages.reconciler import reconcile
from polar.storage.models import Session, SessionEvent
from tests.conftest import redis_database
from tests.processes import session_dirs
from tests.stage_calls import calls_before_postrun, command_task, domain_services, stage_functions, submit_tasks

STAGE_FUNCTIONS = stage_functions()


@pytest.fixture
def services(database_url: str, tmp_path: Path) -> Services:
    return domain_services(database_url, tmp_path, ready_buffer=4)


submit = submit_tasks


def drain(services: Services, before: Callable[[Stage, uuid.UUID], object] | None = None) -> None:
    """Deliver queued stage messages one by one, as workers would, until none are left (``before`` sees each
    first)."""
    sent = services.dispatcher.sent  # type: ignore[attr-defined]
    while sent:
        stage, session_id = sent.pop(0)
        if before is not None:
            before(stage, session_id)
        STAGE_FUNCTIONS[stage](services, session_id)


def sessions(services: Services) -> list[Session]:
    with services.db.unit() as db:
        return list(db.scalars(sa.select(Session).order_by(Session.sample_index)))


def test_a_session_walks_every_stage(services: Services) -> None:
    submit(services, command_task("t", "echo {instruction} > out.txt", runtime={"prepare": [{"run": "echo prep"}]}))
    drain(services)
    (session,) = sessions(services)
    assert session.state == "completed"
    assert session.reward == 1.0 and session.exit_code == 0
    with services.db.unit() as db:
        states = db.scalars(
            sa.select(SessionEvent.to_state).where(SessionEvent.session_id == session.id).order_by(SessionEvent.id)
        ).all()
    assert states == ["pending", "init", "ready", "running", "postrun", "completed"]
    assert session.runtime_handle is None  # torn down
    assert session_dirs(services.config.work_root, session.id) == []


def test_nonzero_exit_fails_with_reward_zero(services: Services) -> None:
    submit(services, command_task("t", "exit 3"))
    drain(services)
    (session,) = sessions(services)
    assert (session.state, session.reward, session.exit_code) == ("failed", 0.0, 3)
    assert "code 3" in (session.error or "")


def test_timeout_kills_the_process_group(services: Services, tmp_path: Path) -> None:
    marker = tmp_path / "child-alive"
    command = f"echo working on it; (sleep 30; touch {marker}) & sleep 30"
    # The budget starts with the harness (nothing before is charged), which outlasts it; 1.5 s is ample for the
    # shell to say what it is doing first.
    submit(services, command_task("t", command, timeout_seconds=1.5))
    drain(services)
    (session,) = sessions(services)
    assert session.state == "timed_out"
    assert session.reward == 0.0
    # What the harness was doing when its time ran out is kept with the error (its directory is gone).
    assert session.error.startswith("harness exceeded the session budget of 1.5s; its last output: ")
    assert "working on it" in session.error
    assert not marker.exists()


def test_failing_prepare_step_ends_failed(services: Services) -> None:
    submit(services, command_task("t", "true", runtime={"prepare": [{"run": "echo nope >&2; exit 7"}]}))
    drain(services)
    attempts = sessions(services)  # preparation is not the policy: each attempt lost, the sample retried
    assert [(s.state, s.outcome, s.reward) for s in attempts] == [("failed", "prepare_failed", None)] * 3
    assert all("exited with code 7" in (s.error or "") and "nope" in (s.error or "") for s in attempts)


def test_redelivered_messages_change_nothing(services: Services) -> None:
    submit(services, command_task("t", "true", num_samples=2))
    sent = services.dispatcher.sent  # type: ignore[attr-defined]
    delivered: list[tuple[Stage, uuid.UUID]] = []
    while sent:
        message = sent.pop(0)
        delivered.append(message)
        STAGE_FUNCTIONS[message[0]](services, message[1])
    for stage, session_id in delivered:  # every message a second time
        STAGE_FUNCTIONS[stage](services, session_id)
    assert not sent
    assert [s.state for s in sessions(services)] == ["completed", "completed"]
    with services.db.unit() as db:
        events = db.scalar(sa.select(sa.func.count()).select_from(SessionEvent))
    assert events == 2 * 6


def test_admission_respects_the_ready_buffer(database_url: str, tmp_path: Path) -> None:
    services = domain_services(database_url, tmp_path, ready_buffer=2)
    submit(services, command_task("t", "true", num_samples=5))
    states = [s.state for s in sessions(services)]
    assert states.count("init") == 2 and states.count("pending") == 3
    drain(services)
    assert [s.state for s in sessions(services)] == ["completed"] * 5


def test_reconciler_recovers_a_lost_run(services: Services) -> None:
    submit(services, command_task("t", "true"))
    sent = services.dispatcher.sent  # type: ignore[attr-defined]
    while sent and sent[0][0] is not Stage.RUN:
        stage, session_id = sent.pop(0)
        STAGE_FUNCTIONS[stage](services, session_id)
    ((_, session_id),) = sent
    sent.clear()
    # The run worker took the session and died: running, with a heartbeat long gone.
    with services.db.unit() as db:
        db.execute(
            sa.update(Session).values(state="running", heartbeat_at=sa.func.now() - sa.text("interval '1 hour'"))
        )
    done = reconcile(services)
    assert done["lost_runs"] == 1
    drain(services, before=calls_before_postrun(services))
    lost, retried = sorted(sessions(services), key=lambda s: s.attempt)
    assert (lost.state, lost.outcome, lost.outcome_class) == ("failed", "worker_lost", "infrastructure")
    assert lost.reward is None and lost.feed_seq is None and lost.retried_as == retried.id
    assert (retried.attempt, retried.sample_index, retried.retry_of) == (2, lost.sample_index, lost.id)
    assert (retried.state, retried.outcome_class, retried.reward) == ("completed", "task", 1.0)


def test_admission_follows_submission_order(database_url: str, tmp_path: Path) -> None:
    services = domain_services(database_url, tmp_path, ready_buffer=1)
    # Four tasks in no sorted order, two samples each: an order by name, id or sample would break it.
    submit(services, *(command_task(name, "true", samples=2) for name in "qwer"))
    order = []
    while services.dispatcher.sent:  # type: ignore[attr-defined]
        stage, session_id = services.dispatcher.sent.pop(0)  # type: ignore[attr-defined]
        if stage is Stage.INIT:
            with services.db.unit() as db:
                session = db.get(Session, session_id)
                order.append((session.task_id, session.sample_index))
        STAGE_FUNCTIONS[stage](services, session_id)
    assert order == [(name, sample) for name in "qwer" for sample in (0, 1)]


def test_the_run_declares_its_proxy_key_so_refusals_before_any_proxy_places_it_count(
    database_url: str, tmp_path: Path
) -> None:
    """While Postgres is away (or a flood holds key lookups) a proxy cannot place a key, and Redis counts its refusals
    only under a key the run stage declared as it minted it (``polar.proxy.refusals``); postrun folds them in."""
    with redis_database() as redis_url:
        services = domain_services(database_url, tmp_path, redis_url=redis_url)
        counter = RefusalCounter(services.db, redis_url)

        def refused_while_away(stage: Stage, session_id: uuid.UUID) -> None:
            if stage is Stage.POSTRUN:  # the harness has run: the key was minted, and declared
                (session,) = sessions(services)
                assert session.proxy_key_hash is not None
                counter.refused(session.proxy_key_hash, None, DATABASE_OUTAGE)
                counter.refused(hash_key("pk-made-up"), None, DATABASE_OUTAGE)  # not a session's: not counted

        submit(services, command_task("t", "true"))
        try:
            drain(services, before=refused_while_away)
            (session,) = sessions(services)
            assert session.state == "completed" and refusal_counts(services.db, session.id) == {"database_outage": 1}
            client = redis.Redis.from_url(redis_url)
            assert client.keys("polar:refusals:*") == []  # folded in, the declaration with it
            client.close()
        finally:
            counter.close()
            services.db.dispose()
