"""A stored batch is always reported as stored (AUDIT F6): admission after the commit is best effort.

The fault is real: Postgres refuses the admission lock. The test holds the ADMISSION advisory lock in a transaction
of its own while the submitter's connections run with a short ``lock_timeout`` (libpq's ``PGOPTIONS``), so the
batch commits and the admission that follows fails with Postgres' own ``lock_not_available``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import sqlalchemy as sa

from polar.batches.cancel import cancel_batch
from polar.contract.task_request import parse_batch_request
from polar.lifecycle.batches import request_hash, submit_batch
from polar.stages.reconciler import reconcile
from polar.storage.locks import ADMISSION
from polar.storage.models import Batch, Session
from tests.stage_calls import command_task, deliver_all, domain_services

BODY = {"tasks": [command_task("t", "true", samples=2)]}


@contextmanager
def admission_held(database_url: str) -> Iterator[None]:
    """The ADMISSION lock, held by another connection until the block ends."""
    engine = sa.create_engine(database_url)
    try:
        with engine.connect() as holder, holder.begin():
            holder.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": ADMISSION})
            yield
    finally:
        engine.dispose()


def test_a_stored_batch_is_reported_stored_when_admission_fails_and_the_reconciler_runs_it_once(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PGOPTIONS", "-c lock_timeout=300")  # the submitter's connections (made lazily, below)
    services = domain_services(database_url, tmp_path)
    request = parse_batch_request(BODY)
    with admission_held(database_url):
        submitted = submit_batch(services, request, request_hash(BODY), "key-1")  # raised before the fix
        again = submit_batch(services, request, request_hash(BODY), "key-1")  # the caller's retry
    assert submitted.created and (again.batch_id, again.created) == (submitted.batch_id, False)
    with services.db.unit() as db:
        assert db.scalar(sa.select(sa.func.count()).select_from(Batch)) == 1
        assert set(db.scalars(sa.select(Session.state))) == {"pending"}  # stored, not admitted
    assert services.dispatcher.sent == []  # type: ignore[attr-defined]

    assert reconcile(services)["admitted"] == 2  # the lock is free again: the reconciler admits what is pending
    deliver_all(services)
    with services.db.unit() as db:
        sessions = db.execute(sa.select(Session.state, Session.attempt)).all()
    assert sorted(sessions) == [("completed", 1), ("completed", 1)]  # each sample ran once


def test_a_cancel_that_committed_is_reported_done_when_admission_fails(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PGOPTIONS", "-c lock_timeout=300")
    services = domain_services(database_url, tmp_path)
    submitted = submit_batch(services, parse_batch_request(BODY), request_hash(BODY), None)
    with admission_held(database_url):
        cancelled = cancel_batch(services, submitted.batch_id)  # raised lock_not_available before the fix
    assert cancelled.cancelled + cancelled.stopping == 2
    deliver_all(services)  # postrun of the sessions that had been admitted
    with services.db.unit() as db:
        assert set(db.scalars(sa.select(Session.state))) == {"cancelled"}
