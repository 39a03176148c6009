"""``EarlyConnection``: the capture insert's connection, checked out and its backend woken while the engine's answer
is read, is the one the insert runs on, goes back to the pool clean whether used or not, and never fails a call:
a connection that died meanwhile is swapped for a fresh one."""

from __future__ import annotations

import os
import random
import resource
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import Future

import pytest
import sqlalchemy as sa

from polar.proxy.recorder import waking as _waking
from polar.services import Services
from polar.storage.calls.write import CallRecord, record_call
from polar.storage.database import Database
from polar.storage.early_connection import EarlyConnection
from tests.polar.storage.test_prompts import running_session, tokens
from tests.polar.storage.test_prompts import services as services  # the fixture: a Postgres-backed Services


@pytest.fixture
def one_connection(database_url: str) -> Iterator[Database]:
    """A pool of exactly one connection, that gives up at once: a second checkout would fail the test."""
    db = Database(database_url, pool_size=1, max_overflow=0, role="polar-proxy", pool_timeout_s=0.5)
    yield db
    db.dispose()


def _call(session_id: uuid.UUID, prompt: list[int], completion: list[int]) -> CallRecord:
    return CallRecord(
        session_id=session_id, agent=None, provider="openai_chat", model="m", stream=False,
        prompt_token_ids=prompt, completion_token_ids=completion, logprobs=[-0.5] * len(completion),
        finish_reason="stop", status_code=200, latency_ms=1.0, engine_latency_ms=None, engine_url=None,
        policy_version=None, request={"n": len(prompt)}, normalized_request={}, response={},
    )  # fmt: skip


def test_the_insert_runs_on_the_woken_connection_and_stays_prepared(
    services: Services, one_connection: Database
) -> None:
    session_id, rng = running_session(services), random.Random(3)
    prompt, pool = tokens(rng, 40), one_connection.engine.pool
    for _ in range(8):  # psycopg prepares a statement on its 6th use on a connection
        completion = tokens(rng, 4)
        with EarlyConnection(one_connection) as early:
            early.wake()
            assert pool.checkedout() == 1  # type: ignore[attr-defined]
            record_call(one_connection, _call(session_id, prompt, completion), uuid.uuid4(), insert_on=early)
        assert pool.checkedout() == 0  # type: ignore[attr-defined]
        prompt = [*prompt, *completion, *tokens(rng, 6)]
    with one_connection.autocommit() as connection:
        prepared = connection.execute(
            sa.text("SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE '%next_seq%'")
        ).scalar()
        stored = connection.execute(sa.text("SELECT count(*) FROM model_calls")).scalar()
    assert (prepared, stored) == (1, 8)


def test_a_woken_connection_not_used_goes_back_idle(one_connection: Database) -> None:
    with EarlyConnection(one_connection) as early:
        early.wake()
        early.wake()  # once: a retried engine request reads a second answer
    assert one_connection.engine.pool.checkedout() == 0  # type: ignore[attr-defined]
    with one_connection.autocommit() as connection:  # the same connection: no empty-query answer left unread
        assert connection.execute(sa.text("SELECT 41 + 1")).scalar() == 42
        assert connection.connection.driver_connection.autocommit is True  # type: ignore[union-attr]


def test_a_connection_that_died_after_waking_is_swapped_for_a_fresh_one(
    services: Services, one_connection: Database
) -> None:
    session_id, rng = running_session(services), random.Random(5)
    with one_connection.autocommit() as connection:  # the pool's one connection exists before it is woken
        connection.execute(sa.text("SELECT 1"))
    with EarlyConnection(one_connection) as early:
        early.wake()
        time.sleep(0.2)  # its empty query answered
        with services.db.autocommit() as admin:
            killed = admin.execute(
                sa.text(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND application_name = 'polar-proxy'"
                )
            ).scalar()
        assert killed == 1
        time.sleep(0.2)  # its end reached the socket
        call_id = record_call(one_connection, _call(session_id, tokens(rng, 20), tokens(rng, 3)), insert_on=early)
    with services.db.autocommit() as connection:
        assert connection.execute(sa.text("SELECT seq FROM model_calls WHERE id = :id"), {"id": call_id}).scalar()
    assert one_connection.engine.pool.checkedout() == 0  # type: ignore[attr-defined]


def test_nothing_is_woken_while_the_parents_read_may_still_need_a_connection(one_connection: Database) -> None:
    parents: Future[object] = Future()
    with EarlyConnection(one_connection) as early:
        _waking(early, parents)()  # type: ignore[arg-type]
        assert one_connection.engine.pool.checkedout() == 0  # type: ignore[attr-defined]
        parents.set_result(None)
        _waking(early, parents)()  # type: ignore[arg-type]
        assert one_connection.engine.pool.checkedout() == 1  # type: ignore[attr-defined]
    assert one_connection.engine.pool.checkedout() == 0  # type: ignore[attr-defined]


@pytest.fixture
def high_descriptors() -> Iterator[None]:
    """Descriptors 0 to ~1,100 held, so the next connection's socket is numbered past 1,023 (as in a busy proxy)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 2048:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(2048, hard), hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        yield
    finally:
        for descriptor in held:
            os.close(descriptor)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_connection_numbered_past_1023_is_woken_and_kept(
    services: Services, one_connection: Database, high_descriptors: None
) -> None:
    """``select`` refuses such a descriptor: every woken connection was thrown away, and the insert opened a new one."""
    session_id, rng = running_session(services), random.Random(7)
    backend = sa.text("SELECT pg_backend_pid()")
    with one_connection.autocommit() as connection:
        assert connection.connection.driver_connection.pgconn.socket > 1023  # type: ignore[union-attr]
        first = connection.execute(backend).scalar()
    for _ in range(3):
        with EarlyConnection(one_connection) as early:
            early.wake()
            record_call(one_connection, _call(session_id, tokens(rng, 20), tokens(rng, 3)), insert_on=early)
    with one_connection.autocommit() as connection:
        assert connection.execute(backend).scalar() == first
