"""The stage outbox on the domain functions: a broker that fails part-way through admission loses nothing, the
submission still succeeds, and the reconciler sends what stayed due (``tests/e2e/test_broker_outage.py`` does the
same with a real Redis stopped)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa

from polar.contract.dispatch import Stage
from polar.errors import BrokerUnavailable
from polar.lifecycle.outbox import send_due
from polar.stages.reconciler import reconcile
from polar.storage.models import Session
from tests.stage_calls import RecordingDispatcher, command_task, deliver_all, domain_services, submit_tasks


@dataclass
class FailingBroker(RecordingDispatcher):
    """Takes ``takes`` messages, then is down until ``up`` is set."""

    takes: int = 0
    up: bool = False

    def send(self, stage: Stage, session_id: uuid.UUID, node: str | None = None) -> None:
        if not self.up and self.takes <= 0:
            raise BrokerUnavailable("connection refused")
        self.takes -= 1
        super().send(stage, session_id, node)


def test_a_broker_failing_mid_admission_loses_nothing(database_url: str, tmp_path: Path) -> None:
    broker = FailingBroker(takes=3)
    services = domain_services(database_url, tmp_path, ready_buffer=8, stale_after_s=1.0)
    services = services.__class__(services.config, services.db, broker, services.worker)

    submit_tasks(services, command_task("t", "true", samples=12))  # returns: the batch is committed
    with services.db.unit() as db:
        rows = db.execute(sa.select(Session.state, Session.due_stage, Session.stage_enqueued_at)).all()
    admitted = [r for r in rows if r.state == "init"]
    assert len(admitted) == 8 and all(r.due_stage == "init" for r in admitted)
    assert sum(r.stage_enqueued_at is not None for r in admitted) == 3  # sent before the broker went down
    assert len(broker.sent) == 3

    broker.up = True
    with services.db.unit() as db:  # the due messages are older than the reconciler's grace
        db.execute(sa.update(Session).values(due_at=sa.func.now() - sa.text("interval '1 minute'")))
    assert reconcile(services)["unsent_sent"] == 5
    deliver_all(services)
    with services.db.unit() as db:
        assert set(db.scalars(sa.select(Session.state))) == {"completed"}


def test_a_due_message_is_sent_once(database_url: str, tmp_path: Path) -> None:
    services = domain_services(database_url, tmp_path)
    submit_tasks(services, command_task("t", "true"))
    with services.db.unit() as db:
        db.execute(sa.update(Session).values(due_at=sa.func.now() - sa.text("interval '1 minute'")))
    assert reconcile(services)["unsent_sent"] == 0  # it went out at submission: nothing is sent twice
    assert [stage for stage, _ in services.dispatcher.sent] == [Stage.INIT]  # type: ignore[attr-defined]


def test_messages_go_out_in_the_order_given(database_url: str, tmp_path: Path) -> None:
    """Admission sends its oldest sessions first; the broker's queue keeps that order only if the outbox does
    (reading the due rows back returned them in the table's order: a test reading ``a0, a1, b0, b1`` off the queue
    once got them mixed)."""
    services = domain_services(database_url, tmp_path, ready_buffer=0)
    submit_tasks(services, command_task("t", "true", samples=6))
    with services.db.unit() as db:
        ids = list(db.scalars(sa.select(Session.id).order_by(Session.sample_index)))
        db.execute(sa.update(Session).values(state="init", due_stage="init", due_at=sa.func.now()))
    wanted = [ids[4], ids[0], ids[5], ids[2], ids[1], ids[3]]
    assert send_due(services, wanted) == 6
    assert [session for _, session in services.dispatcher.sent] == wanted  # type: ignore[attr-defined]
