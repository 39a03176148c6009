"""``polar.records.audit``: actors name a role and a token fingerprint, never the token; rows land in
``audit_log`` and the ``audit_trail`` view names the batch a row acted on; a submission carries its actor in the
batch's transaction."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from polar.contract.task_request import parse_batch_request
from polar.lifecycle.batches import request_hash, submit_batch
from polar.records.audit import Caller, actor, record, record_now
from polar.services import Services
from polar.storage.models import AuditEvent, Batch
from tests.stage_calls import command_task, domain_services


@pytest.fixture
def services(database_url: str, tmp_path: Path) -> Iterator[Services]:
    services = domain_services(database_url, tmp_path, ready_buffer=0)
    yield services
    services.db.dispose()


def test_an_actor_is_the_role_and_a_fingerprint() -> None:
    token = "t" * 40
    assert actor("admin", token) == f"admin:{hashlib.sha256(token.encode()).hexdigest()[:8]}"
    assert actor("read", token).startswith("read:") and token not in actor("read", token)
    assert actor("admin", token) != actor("admin", token + "x")


def test_record_and_the_trail_view(services: Services) -> None:
    body = {"name": "nightly", "tasks": [command_task("a", "true")]}
    caller = Caller(actor("admin", "s" * 40), "10.0.0.7")
    submitted = submit_batch(services, parse_batch_request(body), request_hash(body), caller=caller)
    with services.db.unit() as db:
        assert db.get(Batch, submitted.batch_id).submitted_by == caller.actor  # type: ignore[union-attr]
        record(db, caller.actor, "pause", "engine", {"mode": "wait"}, None)
    record_now(services.db, caller, "cancel", str(submitted.batch_id), {"cancelled": 1})
    with services.db.unit() as db:
        rows = db.scalars(sa.select(AuditEvent).order_by(AuditEvent.id)).all()
        assert [(r.action, r.target, r.remote_addr) for r in rows] == [
            ("submit", str(submitted.batch_id), "10.0.0.7"), ("pause", "engine", None),
            ("cancel", str(submitted.batch_id), "10.0.0.7"),
        ]  # fmt: skip
        assert rows[0].detail == {"name": "nightly", "num_sessions": 1, "idempotency_key": None}
        assert all(r.at is not None for r in rows)
        trail = db.execute(sa.text("SELECT action, batch_id, batch_name FROM audit_trail ORDER BY id")).all()
    assert trail == [("submit", submitted.batch_id, "nightly"), ("pause", None, None),
                     ("cancel", submitted.batch_id, "nightly")]  # fmt: skip


def test_a_submission_without_a_caller_writes_no_row(services: Services) -> None:
    body = {"tasks": [command_task("a", "true")]}
    submitted = submit_batch(services, parse_batch_request(body), request_hash(body))
    with services.db.unit() as db:
        assert db.get(Batch, submitted.batch_id).submitted_by is None  # type: ignore[union-attr]
        assert db.scalar(sa.select(sa.func.count()).select_from(AuditEvent)) == 0
