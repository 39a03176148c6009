"""The capture insert stays a prepared statement on the proxy's connections: the reads a proxy makes between
inserts (the engine control state, a key's session, an engine pin) autocommit, so no ROLLBACK makes psycopg forget
what it prepared (it did: the insert was parsed and planned on every call)."""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from polar.fleet.control import read_state
from polar.proxy.key_owner import session_state_for_key
from polar.services import Services
from polar.storage.calls.read import pinned_engine
from polar.storage.calls.write import CallRecord, record_call
from polar.storage.database import Database
from tests.polar.storage.test_prompts import running_session, tokens
from tests.stage_calls import domain_services


@pytest.fixture
def services(database_url: str, tmp_path: Path) -> Iterator[Services]:
    services = domain_services(database_url, tmp_path)
    yield services
    services.db.dispose()


def test_the_insert_stays_prepared_between_the_proxys_reads(services: Services, database_url: str) -> None:
    session_id, rng = running_session(services), random.Random(7)
    db = Database(database_url, pool_size=1, max_overflow=0, role="polar-proxy")  # one connection: every statement
    try:
        prompt = tokens(rng, 50)
        for _ in range(8):  # psycopg prepares a statement on its 6th use on a connection
            read_state(db)
            session_state_for_key(db, "not-a-key")
            pinned_engine(db, session_id)
            completion = tokens(rng, 5)
            record_call(db, CallRecord(
                session_id=session_id, agent=None, provider="openai_chat", model="m", stream=False,
                prompt_token_ids=prompt, completion_token_ids=completion, logprobs=[-0.5] * 5, finish_reason="stop",
                status_code=200, latency_ms=1.0, engine_latency_ms=None, engine_url=None, policy_version=None,
                request={"n": len(prompt)}, normalized_request={}, response={},
            ), uuid.uuid4())  # fmt: skip
            prompt = [*prompt, *completion, *tokens(rng, 10)]
        with db.autocommit() as connection:
            prepared = connection.execute(
                sa.text("SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE '%next_seq%'")
            ).scalar()
        assert prepared == 1
    finally:
        db.dispose()
