"""Prompts stored as deltas: captured through ``record_call``, read back whole by the API, postrun, the SQL
function ``polar_full_prompt`` and the view ``model_calls_full``; storage grows linearly with a session's turns."""

from __future__ import annotations

import random
import struct
import tracemalloc
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from polar.contract.task_request import parse_batch_request
from polar.errors import PolarError
from polar.lifecycle.batches import request_hash, submit_batch
from polar.lifecycle.sessions import session_calls
from polar.services import Services
from polar.stages.postrun import captured_calls
from polar.storage.calls.write import CallRecord, record_call
from polar.storage.migration import upgrade
from polar.storage.models import ModelCall, Session
from polar.storage.prompts import Chain, PromptView, TokenIds, chain_hash, encode_prompt, full_prompts
from tests.stage_calls import command_task, domain_services

TURN_TOKENS = 100  # new tokens per turn (tool results, user turns)
COMPLETION_TOKENS = 20


@pytest.fixture
def services(database_url: str, tmp_path: Path) -> Iterator[Services]:
    services = domain_services(database_url, tmp_path)
    yield services
    services.db.dispose()


@pytest.fixture
def sqlite_services(tmp_path: Path) -> Iterator[Services]:
    url = f"sqlite:///{tmp_path}/polar.db"
    upgrade(url)
    services = domain_services(url, tmp_path)
    yield services
    services.db.dispose()


def running_session(services: Services) -> uuid.UUID:
    body = {"tasks": [command_task("linear", "true")]}
    batch_id = submit_batch(services, parse_batch_request(body), request_hash(body)).batch_id
    with services.db.unit() as db:
        session_id = db.scalar(sa.select(Session.id).where(Session.batch_id == batch_id))
        db.execute(sa.update(Session).where(Session.id == session_id).values(state="running"))
    assert session_id is not None
    return session_id


def record(
    services: Services,
    session_id: uuid.UUID,
    prompt: list[int],
    completion: list[int],
    agent: str | None = None,
    status: int = 200,
) -> uuid.UUID:
    return record_call(
        services.db,
        CallRecord(
            session_id=session_id, agent=agent, provider="openai_chat", model="m", stream=False,
            prompt_token_ids=prompt, completion_token_ids=completion, logprobs=[-0.5] * len(completion),
            finish_reason="stop", status_code=status, latency_ms=1.0, engine_latency_ms=None, engine_url=None,
            policy_version=None, request={}, normalized_request={}, response={},
        ),
    )  # fmt: skip


def tokens(rng: random.Random, count: int) -> list[int]:
    return [rng.randrange(1, 150_000) for _ in range(count)]


def stored(services: Services, call_id: uuid.UUID) -> ModelCall:
    with services.db.unit() as db:
        call = db.get(ModelCall, call_id)
        assert call is not None
        db.expunge(call)
        return call


def storage(services: Services, session_id: uuid.UUID) -> tuple[int, int, int]:
    """Stored token ids, their bytes on disk, and the tokens the full prompts + completions hold."""
    query = sa.text(
        "SELECT sum(cardinality(prompt_token_ids) + cardinality(completion_token_ids)), "
        "sum(pg_column_size(prompt_token_ids) + pg_column_size(completion_token_ids)), "
        "sum(prompt_len + cardinality(completion_token_ids)) FROM model_calls WHERE session_id = :session_id"
    )
    with services.db.engine.connect() as connection:
        row = connection.execute(query, {"session_id": session_id}).one()
    return int(row[0]), int(row[1]), int(row[2])


def test_fifty_turns_grow_linearly_and_read_back_whole(services: Services) -> None:
    rng = random.Random(4)
    session_id = running_session(services)
    prompt, completion = tokens(rng, TURN_TOKENS), tokens(rng, COMPLETION_TOKENS)
    originals: dict[uuid.UUID, list[int]] = {}
    sizes: dict[int, tuple[int, int, int]] = {}
    for turn in range(1, 51):
        if turn > 1:
            prompt = [*prompt, *completion, *tokens(rng, TURN_TOKENS)]
            completion = tokens(rng, COMPLETION_TOKENS)
        call_id = record(services, session_id, prompt, completion)
        originals[call_id] = prompt
        if turn in (10, 25, 50):
            sizes[turn] = storage(services, session_id)
    print(f"\nstored tokens / stored bytes / full tokens by turns: {sizes}")

    calls = session_calls(services, session_id)
    assert {uuid.UUID(c["call_id"]): c["prompt_token_ids"] for c in calls} == originals
    assert [c["prompt_prefix_len"] for c in calls[:3]] == [
        0,
        TURN_TOKENS + COMPLETION_TOKENS,
        2 * (TURN_TOKENS + COMPLETION_TOKENS),
    ]
    assert calls[0]["prompt_parent_id"] is None and calls[1]["prompt_parent_id"] == calls[0]["call_id"]
    assert {uuid.UUID(c.call_id): list(c.prompt_token_ids) for c in captured_calls(services, session_id)} == originals
    with services.db.engine.connect() as connection:
        in_sql = dict(connection.execute(sa.text("SELECT id, polar_full_prompt(id) FROM model_calls")).all())
        in_view = dict(connection.execute(sa.text("SELECT id, prompt_token_ids FROM model_calls_full")).all())
        counted = connection.execute(
            sa.text("SELECT calls, prompt_tokens FROM session_tokens WHERE session_id = :s"), {"s": session_id}
        ).one()
    assert in_sql == originals and in_view == originals
    assert tuple(counted) == (50, sum(len(p) for p in originals.values()))

    stored_tokens = {turn: size[0] for turn, size in sizes.items()}
    assert stored_tokens == {n: n * (TURN_TOKENS + COMPLETION_TOKENS) for n in (10, 25, 50)}
    for index in (0, 1):  # stored tokens and bytes: the same per turn at 10, 25 and 50 turns
        per_turn = {turn: size[index] / turn for turn, size in sizes.items()}
        assert per_turn[50] <= 1.5 * per_turn[10] and per_turn[25] <= 1.5 * per_turn[10]
    full_per_turn = {turn: size[2] / turn for turn, size in sizes.items()}
    assert full_per_turn[50] > 4 * full_per_turn[10]  # what storing whole prompts would cost: quadratic


def test_a_prompt_extending_nothing_is_stored_whole(services: Services) -> None:
    rng = random.Random(5)
    session_id = running_session(services)
    main_prompt, main_completion = tokens(rng, 50), tokens(rng, 5)
    main = record(services, session_id, main_prompt, main_completion, agent="main")
    sub_prompt = tokens(rng, 40)  # a sub-agent with its own system prompt
    sub = record(services, session_id, sub_prompt, [1, 2], agent="sub")
    assert (stored(services, sub).prompt_parent_id, stored(services, sub).prompt_prefix_len) == (None, 0)
    assert stored(services, sub).prompt_token_ids == sub_prompt and stored(services, sub).prompt_len == 40
    sub_next = record(services, session_id, [*sub_prompt, 1, 2, 9], [3], agent="sub")
    main_next = record(services, session_id, [*main_prompt, *main_completion, 8], [4], agent="main")
    assert stored(services, sub_next).prompt_parent_id == sub and stored(services, sub_next).prompt_token_ids == [9]
    assert stored(services, main_next).prompt_parent_id == main
    assert stored(services, main_next).chain_hash == chain_hash([*main_prompt, *main_completion, 8, 4])
    failed = record(services, session_id, [*main_prompt, *main_completion, 8, 4, 7], [], status=500)
    after_failure = record(services, session_id, [*main_prompt, *main_completion, 8, 4, 7, 6], [5])
    assert stored(services, failed).prompt_parent_id == main_next
    assert stored(services, after_failure).prompt_parent_id == main_next  # an error is never a parent
    prompts = {uuid.UUID(c["call_id"]): c["prompt_token_ids"] for c in session_calls(services, session_id)}
    assert prompts[sub] == sub_prompt and prompts[after_failure][-2:] == [7, 6]
    assert len(captured_calls(services, session_id)) == 5


def test_the_longest_extended_call_is_the_parent(services: Services) -> None:
    rng = random.Random(6)
    session_id = running_session(services)
    p1, c1 = tokens(rng, 30), tokens(rng, 4)
    first = record(services, session_id, p1, c1)
    p2, c2 = [*p1, *c1, *tokens(rng, 10)], tokens(rng, 4)
    second = record(services, session_id, p2, c2)
    branch = record(services, session_id, [*p1, *c1, 77], [5])  # rewinds: extends the first call, not the latest
    assert stored(services, branch).prompt_parent_id == first
    assert stored(services, branch).prompt_prefix_len == 34 and stored(services, branch).prompt_token_ids == [77]
    longest = record(services, session_id, [*p2, *c2, 1], [6])  # extends first, second and not branch: second
    assert stored(services, longest).prompt_parent_id == second and stored(services, longest).prompt_prefix_len == 48
    diverged = record(
        services, session_id, [*p1, c1[0] + 1, *c1[1:], 2, 3], [7]
    )  # changes a sampled token: no full chain
    assert stored(services, diverged).prompt_parent_id is None
    prompts = {uuid.UUID(c["call_id"]): c["prompt_token_ids"] for c in session_calls(services, session_id)}
    assert prompts[longest] == [*p2, *c2, 1] and prompts[branch] == [*p1, *c1, 77]


def test_embedded_sqlite_stores_and_reads_deltas(sqlite_services: Services) -> None:
    session_id = running_session(sqlite_services)
    first = record(sqlite_services, session_id, [1, 2, 3], [4])
    second = record(sqlite_services, session_id, [1, 2, 3, 4, 5], [6])
    assert stored(sqlite_services, second).prompt_parent_id == first
    assert stored(sqlite_services, second).prompt_token_ids == [5]
    prompts = [c["prompt_token_ids"] for c in session_calls(sqlite_services, session_id)]
    assert prompts == [[1, 2, 3], [1, 2, 3, 4, 5]]


def test_encode_and_rebuild_round_trip() -> None:
    first_id, second_id = uuid.uuid4(), uuid.uuid4()
    first = encode_prompt([1, 2], [3], [])
    assert (first.parent_id, first.token_ids, first.prompt_len) == (None, [1, 2], 2)
    chain = Chain(first_id, 3, first.chain_hash)
    second = encode_prompt([1, 2, 3, 4], [5], [Chain(uuid.uuid4(), 3, "other"), chain])
    assert (second.parent_id, second.prefix_len, second.token_ids) == (first_id, 3, [4])
    assert encode_prompt([1, 2], [], [chain]).parent_id is None  # shorter than the chain

    class Row:
        def __init__(self, id: uuid.UUID, parent: uuid.UUID | None, prefix: int, prompt: list[int]) -> None:
            self.id, self.prompt_parent_id, self.prompt_prefix_len = id, parent, prefix
            self.prompt_token_ids, self.completion_token_ids = prompt, [3] if parent is None else [5]

    rows = [Row(first_id, None, 0, [1, 2]), Row(second_id, first_id, 3, [4])]
    assert full_prompts(rows) == {first_id: [1, 2], second_id: [1, 2, 3, 4]}
    with pytest.raises(PolarError):
        full_prompts(rows[1:])


def _int32(ids: list[int]) -> bytes:
    return struct.pack(f"<{len(ids)}i", *ids)


@pytest.mark.parametrize("seed", range(20))
def test_a_prompt_hashed_past_its_last_turn_picks_what_a_whole_hash_picks(seed: int) -> None:
    """An agent's prompts as ``KnownPrompts`` hands them over (one ``TokenIds`` grown turn by turn, or copied), hashed
    only past the last turn, give the same delta and chain hash as plain lists hashed whole, whatever the chains."""
    rng = random.Random(seed)
    prompt: list[int] = [rng.randrange(100) for _ in range(rng.randrange(1, 40))]
    grown = TokenIds(prompt, _int32(prompt))
    chains: list[Chain] = []
    for _ in range(12):
        completion = [rng.randrange(100) for _ in range(rng.randrange(0, 6))]
        whole = encode_prompt(list(prompt), completion, chains)
        assert encode_prompt(grown, completion, chains) == whole
        call = Chain(uuid.uuid4(), len(prompt) + len(completion), whole.chain_hash)
        chains += [call] + [Chain(uuid.uuid4(), rng.randrange(1, call.length + 5), "other")] * rng.randrange(2)
        if rng.random() < 0.3:  # a retried call: an equal chain, the latest wins
            chains.append(Chain(uuid.uuid4(), call.length, call.chain_hash))
        # The next turn: usually the chain and more, sometimes re-rendered (the completion's tokens differ).
        kept = completion if rng.random() < 0.7 else [rng.randrange(100) for _ in completion]
        tail = kept + [rng.randrange(100) for _ in range(rng.randrange(0, 30))]
        prompt = prompt + tail
        if rng.random() < 0.5:
            grown.extend(tail)
            grown.int32 += _int32(tail)
        else:
            grown = TokenIds(grown + tail, grown.int32 + _int32(tail), grown.digest)
        assert grown == prompt


def test_postrun_reads_prompts_through_their_deltas(services: Services) -> None:
    """Audit F19: postrun joined every call's full prompt, the sum of all prompt lengths (200 calls of 40k tokens:
    8M ids). Its prompts are views on the stored deltas now: what it allocates is counted (tracemalloc), not timed."""
    rng = random.Random(5)
    session_id = running_session(services)
    prompt, completion = tokens(rng, 400), tokens(rng, 50)
    originals = []
    for turn in range(60):
        if turn:
            prompt = [*prompt, *completion, *tokens(rng, 400)]
            completion = tokens(rng, 50)
        record(services, session_id, prompt, completion)
        originals.append(prompt)
    tracemalloc.start()
    try:
        calls = captured_calls(services, session_id)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    joined = 8 * sum(len(p) for p in originals)  # a list pointer per id of every prompt: 6.6 MB here
    print(f"\ncaptured_calls peak {peak / 2**20:.1f} MiB; every prompt joined {joined / 2**20:.1f} MiB")
    assert peak < joined / 3  # before: more than ``joined``
    assert [list(call.prompt_token_ids) for call in calls] == originals
    assert calls[-1].prompt_token_ids == originals[-1] and calls[3].prompt_token_ids != originals[2]


def test_a_prompt_view_reads_like_the_joined_list() -> None:
    first = PromptView(None, 0, [1, 2, 3])
    chain = PromptView(first, 3, [4, 5])  # prompt + completion
    cut = PromptView(chain, 4, [9])  # takes 4 of the chain's 5, then its own
    assert list(cut) == [1, 2, 3, 4, 9] and len(cut) == 5 and cut == [1, 2, 3, 4, 9] and cut == (1, 2, 3, 4, 9)
    assert cut[0] == 1 and cut[3] == 4 and cut[4] == 9 and cut[-1] == 9 and cut[1:4] == [2, 3, 4]
    assert cut != [1, 2, 3, 4, 5] and cut != [1, 2, 3, 4] and PromptView(None, 0, []) == []
    with pytest.raises(IndexError):
        cut[5]
