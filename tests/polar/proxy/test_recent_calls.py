"""A call's parents from the proxy process's memory (``polar.storage.calls.recent``) instead of a SELECT: stored
exactly as the database read stores them, stale (and read again) once another process recorded a call in between,
forgotten when the session stops; every call reads back exactly whatever its parents were."""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

import pytest
import sqlalchemy as sa

from polar.errors import SessionNotRunning
from polar.lifecycle.sessions import session_calls
from polar.services import Services
from polar.storage.calls import write as capture
from polar.storage.calls.recent import MAX_CHAINS, Latest, RecentCalls
from polar.storage.calls.write import CallRecord, read_parents, record_call
from polar.storage.models import ModelCall, Session
from polar.storage.prompts import Chain
from tests.polar.storage.test_payloads import _agent_call, _stored_payloads
from tests.polar.storage.test_prompts import running_session
from tests.polar.storage.test_prompts import services as services  # the fixture: a Postgres-backed Services


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[uuid.UUID]:
    """The sessions whose parents were read from the database, one entry a read (the real statement runs)."""
    seen: list[uuid.UUID] = []
    rows = capture._CANDIDATES_POSTGRES.rows

    def counted(connection: sa.Connection, bound: dict[str, Any]) -> Any:
        seen.append(bound["session_id"])
        return rows(connection, bound)

    monkeypatch.setattr(capture._CANDIDATES_POSTGRES, "rows", counted)
    return seen


def _call(turn: int, session_id: uuid.UUID, agent: str | None = None) -> CallRecord:
    return dataclasses.replace(_agent_call(turn, agent), session_id=session_id)


def _prompt_columns(services: Services, session_id: uuid.UUID) -> list[tuple[Any, ...]]:
    query = sa.text(
        "SELECT prompt_token_ids::text, prompt_prefix_len, chain_hash, agent, "
        "(SELECT seq FROM model_calls p WHERE p.id = c.prompt_parent_id), "
        "(SELECT seq FROM model_calls p WHERE p.id = c.payload_parent_id) FROM model_calls c "
        "WHERE session_id = :s ORDER BY c.seq"
    )
    with services.db.engine.connect() as connection:
        return [tuple(row) for row in connection.execute(query, {"s": session_id})]


def _read_back(services: Services, session_id: uuid.UUID) -> list[tuple[Any, ...]]:
    return [(c["prompt_token_ids"], c["request"], c["normalized_request"], c["response"])
            for c in session_calls(services, session_id)]  # fmt: skip


def test_parents_from_memory_store_what_a_database_read_stores(services: Services, reads: list[uuid.UUID]) -> None:
    remembered, read = running_session(services), running_session(services)
    recent = RecentCalls()
    turns = [(turn, agent) for turn in range(8) for agent in (None, "explorer")]  # two agents, interleaved
    for turn, agent in turns:
        record_call(services.db, _call(turn, remembered, agent), recent=recent)
        record_call(services.db, _call(turn, read, agent))
    assert _prompt_columns(services, remembered) == _prompt_columns(services, read)
    assert _stored_payloads(services, remembered) == _stored_payloads(services, read)
    assert _read_back(services, remembered) == _read_back(services, read)
    # Read once for each agent's first call; every later call took its parents from memory.
    assert reads.count(remembered) == 2 and reads.count(read) == len(turns)


def test_the_early_read_takes_memory_too(services: Services, reads: list[uuid.UUID]) -> None:
    session_id, recent = running_session(services), RecentCalls()
    for turn in range(4):
        record = _call(turn, session_id)
        parts = {part: getattr(record, part) for part in ("request", "normalized_request")}
        parents = read_parents(services.db, session_id, None, parts, recent=recent)
        record_call(services.db, record, parents=parents, recent=recent)
    assert reads == [session_id]
    assert [row[5] for row in _prompt_columns(services, session_id)] == [None, 1, 2, 3]  # each on the last


def test_a_call_recorded_by_another_process_makes_memory_stale(services: Services, reads: list[uuid.UUID]) -> None:
    session_id, here, elsewhere = running_session(services), RecentCalls(), RecentCalls()
    records = [_call(turn, session_id) for turn in range(5)]
    record_call(services.db, records[0], recent=here)  # read: seq 1
    record_call(services.db, records[1], recent=elsewhere)  # another proxy process: seq 2
    record_call(services.db, records[2], recent=here)  # from memory, which lacks call 2: a delta on call 1
    assert here.parents(session_id, None) is None  # seq 3 is not one past 1: stale
    record_call(services.db, records[3], recent=here)  # read again: a delta on call 3
    record_call(services.db, records[4], recent=here)  # from memory again: a delta on call 4
    assert reads == [session_id, session_id, session_id]
    assert [row[5] for row in _prompt_columns(services, session_id)] == [None, 1, 1, 3, 4]
    assert [row[0] for row in _read_back(services, session_id)] == [r.prompt_token_ids for r in records]
    assert [row[3] for row in _read_back(services, session_id)] == [r.response for r in records]


def test_a_session_that_stopped_is_forgotten(services: Services) -> None:
    session_id, recent = running_session(services), RecentCalls()
    record_call(services.db, _call(0, session_id), recent=recent)
    assert recent.parents(session_id, None) is not None
    with services.db.unit() as db:
        db.execute(sa.update(Session).where(Session.id == session_id).values(state="completed"))
    with pytest.raises(SessionNotRunning):
        record_call(services.db, _call(1, session_id), recent=recent)
    assert recent.parents(session_id, None) is None
    with services.db.engine.connect() as connection:
        assert connection.execute(sa.select(sa.func.count()).select_from(ModelCall)).scalar() == 1


def test_memory_is_bounded() -> None:
    recent, session_id = RecentCalls(max_sessions=3), uuid.uuid4()
    for seq in range(1, MAX_CHAINS + 10):
        call = Latest(uuid.uuid4(), seq, {})
        recent.recorded(session_id, None, call, Chain(call.id, seq * 10, f"h{seq}"), None if seq > 1 else ([], None))
    chains, latest = recent.parents(session_id, None) or ([], None)
    assert len(chains) == MAX_CHAINS and chains[-1].length == (MAX_CHAINS + 9) * 10 and latest.seq == MAX_CHAINS + 9
    assert [chain.length for chain in chains] == sorted(chain.length for chain in chains)  # oldest first
    others = [uuid.uuid4() for _ in range(3)]
    for other in others:
        recent.recorded(other, None, Latest(uuid.uuid4(), 1, {}), None, ([], None))
    assert recent.parents(session_id, None) is None  # the least recently recorded session went first
    assert all(recent.parents(other, None) is not None for other in others)
