"""Payloads stored as deltas (``polar.storage.payloads``): every delta decodes to exactly the payload, key order
included, and a session's stored bytes stay flat per turn."""

from __future__ import annotations

import copy
import dataclasses
import json
import random
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import given, settings
from hypothesis import strategies as st

from polar.errors import PolarError
from polar.lifecycle.sessions import call_page, calls_by_session, session_calls
from polar.services import Services
from polar.stages.postrun import captured_calls, final_message
from polar.storage.calls.write import CallRecord, read_parents, record_call
from polar.storage.migration import downgrade, upgrade
from polar.storage.payloads import PARTS, capture_payload, decode_payload, full_payloads
from tests.polar.storage.test_prompts import running_session
from tests.stage_calls import domain_services

PROMPT = [5, 6, 7, 8]


def _round_trip(parent: Any, payload: Any, prompt: list[int] | None = PROMPT) -> Any:
    _, parent_index = capture_payload(parent, None, prompt)
    stored, _ = capture_payload(payload, parent_index or {}, prompt)
    decoded = decode_payload(stored, parent, prompt)
    assert decoded == payload
    if isinstance(payload, dict):
        assert list(decoded) == list(payload)  # key order: a reordered tool schema tokenises differently
    return stored


def _conversation(turns: int) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "be brief " * 50}]
    for turn in range(turns):
        messages += [{"role": "user", "content": f"question {turn} " * 20},
                     {"role": "assistant", "content": f"answer {turn}"}]  # fmt: skip
    return {"model": "m", "messages": messages, "tools": [{"name": "read", "schema": {"a": 1}}], "stream": False}


def test_an_appended_history_stores_only_the_new_turns() -> None:
    parent, child = _conversation(3), _conversation(4)
    stored = _round_trip(parent, child)
    ops = {op[0]: op for op in stored["delta"]}
    assert ops["model"] == ["model", "="] and ops["tools"] == ["tools", "="] and ops["stream"] == ["stream", "="]
    assert ops["messages"][:3] == ["messages", "+", 7] and ops["messages"][3] == child["messages"][7:]


def test_rewritten_last_messages_still_share_the_rest() -> None:
    """Claude Code moves its cache marker to the newest message every turn: the one before changes."""
    parent, child = _conversation(6), _conversation(7)
    child["messages"][-3] = {**child["messages"][-3], "cache_control": {"type": "ephemeral"}}
    stored = _round_trip(parent, child)
    op = next(op for op in stored["delta"] if op[0] == "messages")
    assert op[1] == "+" and op[2] == len(parent["messages"]) - 1


def test_the_calls_own_prompt_is_a_reference() -> None:
    parent = {"id": "a", "prompt_token_ids": [1, 2], "choices": [{"text": "x"}]}
    child = {"id": "b", "prompt_token_ids": list(PROMPT), "choices": [{"text": "y"}]}
    stored = _round_trip(parent, child)
    assert ["prompt_token_ids", "t"] in stored["delta"]
    assert decode_payload(stored, parent, None)["prompt_token_ids"] is None  # read only as a parent


def test_nested_objects_diff_key_by_key() -> None:
    parent = {"prompt": [1], "polar_tito": {"chain_call_id": "a", "messages": _conversation(2)["messages"]}}
    child = {"prompt": [1], "polar_tito": {"chain_call_id": "b", "messages": _conversation(3)["messages"]}}
    stored = _round_trip(parent, child)
    nested = next(op for op in stored["delta"] if op[0] == "polar_tito")
    assert nested[1] == "{" and ["chain_call_id", "v", "b"] in nested[2]


def test_what_is_not_an_object_is_stored_whole() -> None:
    assert _round_trip({"a": 1}, [1, 2]) == {"value": [1, 2]}
    assert _round_trip([1], {"a": 1}) == {"delta": [["a", "v", 1]]}
    assert capture_payload({"a": 1}, None) == ({"a": 1}, {"a": {"h": capture_payload({"a": 1}, None)[1]["a"]["h"]}})


def test_values_the_fast_encoder_refuses_round_trip() -> None:
    _round_trip({"seed": 2**70, "a": [2**65]}, {"seed": 2**70, "a": [2**65, 3]})


def test_a_delta_that_does_not_fit_is_an_error() -> None:
    with pytest.raises(PolarError):
        decode_payload({"delta": [["messages", "+", 3, []]]}, {}, None)
    with pytest.raises(PolarError):
        decode_payload({"whatever": 1}, {}, None)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=5),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=3), children, max_size=5),
    max_leaves=30,
)


@settings(max_examples=100, deadline=None)
@given(parent=st.dictionaries(st.text(max_size=3), json_values, max_size=6), data=st.data())
def test_any_edit_round_trips(parent: dict[str, Any], data: st.DataObject) -> None:
    child = copy.deepcopy(parent)
    for key in data.draw(st.lists(st.text(max_size=3), max_size=3)):
        child[key] = data.draw(json_values)
    for value in child.values():
        if isinstance(value, list):
            value.extend(data.draw(st.lists(json_values, max_size=3)))
    _round_trip(parent, child)


def test_a_chain_of_calls_reads_back_through_full_payloads() -> None:
    class Row:
        def __init__(self, id: int, parent: int | None, stored: dict[str, Any]) -> None:
            self.id, self.payload_parent_id = id, parent
            self.request, self.normalized_request, self.response = (stored[part] for part in PARTS)

    rng = random.Random(3)
    rows, originals, index = [], {}, None
    for call in range(30):
        payloads = {"request": _conversation(call + 1), "normalized_request": _conversation(call + 1),
                    "response": {"choices": [{"text": str(rng.random())}], "prompt_token_ids": PROMPT}}  # fmt: skip
        stored, new_index = {}, {}
        for part, payload in payloads.items():
            stored[part], new_index[part] = capture_payload(payload, None if index is None else index[part], PROMPT)
        rows.append(Row(call, call - 1 if call else None, stored))
        originals[call], index = payloads, new_index
    assert full_payloads(rows, {call: PROMPT for call in originals}) == originals
    with pytest.raises(PolarError):
        full_payloads(rows[1:], {})


# Captured through the proxy's capture path, read back by the API, postrun, exports and SQL.


@pytest.fixture
def services(database_url: str, tmp_path: Path) -> Iterator[Services]:
    services = domain_services(database_url, tmp_path)
    yield services
    services.db.dispose()


def _agent_call(turn: int, agent: str | None = None) -> CallRecord:
    """Call ``turn`` of an agent session: the whole conversation resent, a response holding the full prompt."""
    request = _conversation(turn + 1)
    prompt = list(range(1, 40 * (turn + 1)))
    response = {"id": f"chatcmpl-{turn}", "choices": [{"index": 0, "message": {"role": "assistant",
                "content": f"answer {turn}"}, "token_ids": [7, 8]}], "prompt_token_ids": prompt}  # fmt: skip
    return CallRecord(
        session_id=uuid.uuid4(), agent=agent, provider="openai_chat", model="m", stream=False,
        prompt_token_ids=prompt, completion_token_ids=[7, 8], logprobs=[-0.5, -0.25], finish_reason="stop",
        status_code=200, latency_ms=1.0, engine_latency_ms=None, engine_url=None, policy_version=None,
        request=request, normalized_request={**request, "return_token_ids": True}, response=response,
    )  # fmt: skip


def _payload_bytes(services: Services, session_id: uuid.UUID) -> int:
    query = sa.text(
        "SELECT sum(pg_column_size(request) + pg_column_size(normalized_request) + pg_column_size(response) "
        "+ coalesce(pg_column_size(payload_index), 0)) FROM model_calls WHERE session_id = :s"
    )
    with services.db.engine.connect() as connection:
        return int(connection.execute(query, {"s": session_id}).scalar() or 0)


def test_an_agent_session_reads_back_whole_everywhere(services: Services) -> None:
    session_id = running_session(services)
    originals, sizes = {}, {}
    for turn in range(40):
        record = dataclasses.replace(_agent_call(turn), session_id=session_id)
        call_id = record_call(services.db, record)
        originals[call_id] = {part: getattr(record, part) for part in PARTS}
        if turn + 1 in (10, 40):
            sizes[turn + 1] = _payload_bytes(services, session_id)
    title = dataclasses.replace(_agent_call(0, agent="title"), session_id=session_id)  # another agent's first call
    originals[record_call(services.db, title)] = {part: getattr(title, part) for part in PARTS}

    read = {uuid.UUID(c["call_id"]): {part: c[part] for part in PARTS} for c in session_calls(services, session_id)}
    assert read == originals
    with services.db.engine.connect() as connection:
        stored = connection.execute(sa.text("SELECT payload_parent_id FROM model_calls ORDER BY seq")).scalars().all()
        in_sql = connection.execute(
            sa.text("SELECT id, request::text, normalized_request::text, response::text FROM model_calls_full")
        ).all()
    assert stored[0] is None and all(stored[1:40]) and stored[40] is None  # the title call starts its own
    assert {row[0]: {p: json.loads(t) for p, t in zip(PARTS, row[1:], strict=True)} for row in in_sql} == originals
    last = list(originals)[39]
    # Each call's answer reads back whole through the deltas: the main chain's last, and the title call's after it.
    calls = captured_calls(services, session_id)
    assert [final_message(services, session_id, call) for call in (calls[39], calls[40])] == ["answer 39", "answer 0"]
    assert originals[last]["response"]["choices"][0]["message"]["content"] == "answer 39"
    # Flat per turn (the index grows with the log of the history): whole payloads would cost 4x per call at 40.
    assert sizes[40] / 40 < 1.5 * sizes[10] / 10, sizes


def test_a_page_of_calls_needs_only_its_own_prompts(services: Services) -> None:
    session_id = running_session(services)
    ids = [record_call(services.db, dataclasses.replace(_agent_call(turn), session_id=session_id)) for turn in range(7)]
    first = call_page(services, session_id, after=0, limit=3)
    second = call_page(services, session_id, after=first["next_after"] or 0, limit=3)
    third = call_page(services, session_id, after=second["next_after"] or 0, limit=3)
    assert [c["seq"] for c in first["items"] + second["items"] + third["items"]] == list(range(1, 8))
    assert (first["next_after"], second["next_after"], third["next_after"]) == (3, 6, None)
    assert [uuid.UUID(c["call_id"]) for c in second["items"]] == ids[3:6]
    assert second["items"][0]["response"]["prompt_token_ids"] == _agent_call(3).prompt_token_ids


def test_many_sessions_read_back_in_one_go_as_one_by_one(services: Services) -> None:
    sessions = [running_session(services) for _ in range(3)]
    for index, session_id in enumerate(sessions[:2]):
        for turn in range(3 + index):
            record_call(services.db, dataclasses.replace(_agent_call(turn), session_id=session_id))
    unknown = uuid.uuid4()
    together = calls_by_session(services, [*sessions, unknown])
    assert together == {**{s: session_calls(services, s) for s in sessions}, unknown: []}
    assert [len(together[s]) for s in sessions] == [3, 4, 0]


@pytest.mark.parametrize("backend", ["postgres", "sqlite"])
def test_downgrading_stores_every_payload_whole(backend: str, database_url: str, tmp_path: Path) -> None:
    url = database_url if backend == "postgres" else f"sqlite:///{tmp_path}/polar.db"
    if backend == "sqlite":
        upgrade(url)
    services = domain_services(url, tmp_path)
    session_id = running_session(services)
    records = [dataclasses.replace(_agent_call(turn), session_id=session_id) for turn in range(5)]
    for record in records:
        record_call(services.db, record)
    services.db.dispose()
    downgrade(url, "0009")
    engine = sa.create_engine(url)
    with engine.connect() as connection:
        rows = connection.execute(sa.text("SELECT request, response FROM model_calls ORDER BY seq")).all()
    engine.dispose()
    loaded = [[json.loads(value) if isinstance(value, str) else value for value in row] for row in rows]
    assert loaded == [[record.request, record.response] for record in records]


def _stored_payloads(services: Services, session_id: uuid.UUID) -> list[tuple[Any, ...]]:
    query = sa.text(
        "SELECT request::text, normalized_request::text, response::text, payload_index::text, seq - 1 = "
        "(SELECT seq FROM model_calls p WHERE p.id = c.payload_parent_id) FROM model_calls c "
        "WHERE session_id = :s ORDER BY seq"
    )
    with services.db.engine.connect() as connection:
        return [tuple(row) for row in connection.execute(query, {"s": session_id})]


def test_payloads_stored_while_the_engine_generates_are_the_same(services: Services) -> None:
    """The proxy stores a call's request parts while the engine generates (``read_parents`` with payloads), before
    the prompt is known: what it stores is what the capture after the answer stores. A request holding a list of
    ints, which the prompt might equal (stored as a reference to it), is left to that capture."""
    early, late = running_session(services), running_session(services)
    for turn in range(12):
        record = _agent_call(turn)
        if turn == 7:  # a client body that repeats the prompt: the capture stores it as a reference ("t")
            record = dataclasses.replace(record, request={**record.request, "ids": record.prompt_token_ids})
        parts = {part: getattr(record, part) for part in ("request", "normalized_request")}
        parents = read_parents(services.db, early, None, parts)
        assert bool(parents.payloads) == (turn != 7)
        record_call(services.db, dataclasses.replace(record, session_id=early), parents=parents)
        record_call(services.db, dataclasses.replace(record, session_id=late))
    stored = _stored_payloads(services, early)
    assert stored == _stored_payloads(services, late)
    assert '"t"' in stored[7][0] and all(row[4] for row in stored[1:])  # each a delta on the call before


def test_token_prompt_payloads_stored_early_hold_only_for_the_prompt_read(services: Services) -> None:
    """TITO: the normalised request holds the token prompt the proxy built, stored early as a reference to the
    call's prompt. That holds when the engine read that prompt; when it read another, the capture stores it anew."""
    early, late = running_session(services), running_session(services)
    for turn in range(6):
        record = _agent_call(turn)
        sent = list(record.prompt_token_ids)  # the prompt built and sent (a list of its own)
        record = dataclasses.replace(record, normalized_request={"prompt": sent, "max_tokens": 8})
        read = sent if turn != 3 else [*sent[:-1], 99_999]  # the engine's reading; once, not what was sent
        record = dataclasses.replace(record, prompt_token_ids=read)
        parents = read_parents(services.db, early, None, {"normalized_request": record.normalized_request}, sent)
        record_call(services.db, dataclasses.replace(record, session_id=early), parents=parents)
        record_call(services.db, dataclasses.replace(record, session_id=late))
    stored = _stored_payloads(services, early)
    assert stored == _stored_payloads(services, late)
    assert '"t"' in stored[2][1] and '"t"' not in stored[3][1]
