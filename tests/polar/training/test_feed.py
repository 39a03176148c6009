"""The trainers' feed on the domain functions: commit-ordered cursor, whole groups, batch scope, long-poll."""

from __future__ import annotations

import math
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy
import pytest
import sqlalchemy as sa

from polar.contract.dispatch import Stage
from polar.lifecycle.sessions import session_trajectories
from polar.services import Services
from polar.storage.calls.read import routed_experts_of_sessions
from polar.storage.migration import upgrade
from polar.storage.models import ModelCall, Session, Trajectory
from polar.storage.serialization import trajectory_json
from polar.training.feed import FeedPage, read_feed, wait_for_feed
from tests.stage_calls import command_task, domain_services, stage_functions, submit_tasks


@pytest.fixture
def services(database_url: str, tmp_path: Path) -> Services:
    return domain_services(database_url, tmp_path, ready_buffer=100)


submit = submit_tasks
STAGE_FUNCTIONS = stage_functions()


def add_call(services: Services, session_id: uuid.UUID) -> None:
    """A captured call, as the proxy would have stored it, so postrun has a trajectory to build."""
    with services.db.unit() as db:
        db.add(
            ModelCall(
                session_id=session_id, seq=1, provider="openai_chat", stream=False, prompt_token_ids=[1, 2, 3],
                completion_token_ids=[4, 5], logprobs=[-0.1, -0.2], finish_reason="stop", status_code=200,
                latency_ms=1.0, request={}, normalized_request={}, response={},
            )
        )  # fmt: skip


def finish(services: Services, session_ids: set[uuid.UUID]) -> None:
    """Run every queued stage of these sessions to the end (other sessions' messages stay queued)."""
    sent = services.dispatcher.sent  # type: ignore[attr-defined]
    while any(session in session_ids for _, session in sent):
        index = next(i for i, (_, session) in enumerate(sent) if session in session_ids)
        stage, session_id = sent.pop(index)
        if stage is Stage.POSTRUN:
            add_call(services, session_id)
        STAGE_FUNCTIONS[stage](services, session_id)


def queued_sessions(services: Services, stage: Stage = Stage.INIT) -> list[uuid.UUID]:
    return [session for queued, session in services.dispatcher.sent if queued is stage]  # type: ignore[attr-defined]


def test_cursor_order_groups_and_batch_scope(services: Services) -> None:
    batch = submit(services, command_task("a", "true", samples=2), command_task("b", "true", samples=2))
    a0, a1, b0, b1 = queued_sessions(services)
    finish(services, {b0})
    finish(services, {a0})
    first = read_feed(services, batch, after=0, limit=10)
    assert [item["session_id"] for item in first.items] == [str(b0), str(a0)]  # the order sessions ended
    assert first.next_cursor == 2
    assert read_feed(services, batch, after=0, limit=10, groups=True).items == []  # no group complete yet
    finish(services, {a1})
    groups = read_feed(services, batch, after=0, limit=10, groups=True)
    assert {item["session_id"] for item in groups.items} == {str(a0), str(a1)}
    assert {item["group_id"] for item in groups.items} == {groups.items[0]["group_id"]}
    assert groups.items[0]["group_size"] == 2 and groups.next_cursor == 3
    after_a = read_feed(services, batch, after=first.next_cursor, limit=10)
    assert [item["session_id"] for item in after_a.items] == [str(a1)]
    other = submit(services, command_task("c", "true"))
    (c0,) = [s for s in queued_sessions(services) if s not in {b1}]
    finish(services, {c0})
    assert read_feed(services, batch, after=3, limit=10).items == []  # another batch's session is not in it
    assert [i["session_id"] for i in read_feed(services, other, after=0, limit=10).items] == [str(c0)]
    everything = read_feed(services, None, after=0, limit=2)
    assert everything.next_cursor == 2  # limit counts sessions; the cursor resumes after them


def test_long_poll_returns_when_a_session_ends(services: Services) -> None:
    batch = submit(services, command_task("a", "true"))
    (session,) = queued_sessions(services)
    started = time.monotonic()
    empty = wait_for_feed(services, batch, after=0, limit=10, groups=False, wait_s=0.5)
    assert empty.items == [] and empty.next_cursor == 0 and time.monotonic() - started >= 0.5
    # A long-poll that may wait 600 s is woken by the session's end: it returns with the session long before its
    # wait is over (the 120 s join below is a hang guard, not a speed claim).
    pages: list[FeedPage] = []
    poll = threading.Thread(
        target=lambda: pages.append(wait_for_feed(services, batch, after=0, limit=10, groups=False, wait_s=600))
    )
    poll.start()
    time.sleep(0.5)
    assert poll.is_alive() and not pages  # nothing has ended: it waits
    finish(services, {session})
    poll.join(120)
    assert not poll.is_alive(), "the long-poll was not woken by the session's end"
    assert [item["session_id"] for item in pages[0].items] == [str(session)]


def _statements(services: Services, read: Callable[[], FeedPage]) -> tuple[FeedPage, int]:
    """A page, and how many SQL statements reading it took."""
    executed: list[str] = []

    def count(*_: object) -> None:
        executed.append("statement")

    sa.event.listen(services.db.engine, "before_cursor_execute", count)
    try:
        page = read()
    finally:
        sa.event.remove(services.db.engine, "before_cursor_execute", count)
    return page, len(executed)


def test_a_pages_statements_do_not_grow_with_its_size(services: Services) -> None:
    # A page of 10 groups of 100 is 1,000 sessions' trajectories: read per session or per call id, it took
    # hundreds of statements (or ten thousand index probes); it is a fixed handful however many it holds.
    batch = submit(services, *[command_task(name, "true", samples=2) for name in "abcd"])
    finish(services, set(queued_sessions(services)))
    small, few = _statements(services, lambda: read_feed(services, batch, after=0, limit=1, groups=True))
    large, many = _statements(services, lambda: read_feed(services, batch, after=0, limit=4, groups=True))
    assert (len(small.items), len(large.items)) == (2, 8)
    assert few == many <= 6, (few, many)


def test_items_written_by_postgres_are_the_trajectories_json(services: Services) -> None:
    """The feed has Postgres write each trajectory's part of its item; read back, it is ``trajectory_json`` of the
    same row (float4 logprobs to the floats psycopg reads, 0.0 included; stats, reward, expert routing) plus the
    item's own fields."""
    batch = submit(services, command_task("a", "true", samples=2))
    first, second = queued_sessions(services)
    finish(services, {first, second})
    logprobs = [0.0, -0.1, -1e-7, -23.456789, -0.0, -3.4e38, float("-inf"), float("nan")]
    with services.db.unit() as db:
        db.execute(sa.update(ModelCall).where(ModelCall.session_id == first).values(routed_experts=b"\x93NUMPY"))
        db.execute(
            sa.update(Trajectory).where(Trajectory.session_id == first)
            .values(logprobs=logprobs, stats={"turns": 3, "nested": {"b": [1.5, None], "a": "é"}}, reward=0.25,
                    agent="planner")
        )  # fmt: skip
        rows = {
            row.session_id: row
            for row in db.execute(sa.select(Trajectory.__table__).where(Trajectory.session_id.in_([first, second])))
        }
        routed = routed_experts_of_sessions(db, [first, second])
        # The trigger wrote the JSON the feed builds for rows stored before it (migration 0019), to the byte.
        built = sa.func.polar_trajectory_json(sa.literal_column("trajectories"))
        assert db.scalars(sa.select(Trajectory.feed_json == built).where(Trajectory.session_id == first)).all() == [
            True
        ]
    for stored in (True, False):  # written by the trigger; then a row stored before it, built by the feed
        items = {item["session_id"]: item for item in read_feed(services, batch, after=0, limit=10).items}
        for session_id, row in rows.items():
            item, expected = items[str(session_id)], dict(trajectory_json(row, routed))
            # As orjson writes them: a logprob that is no number is null.
            expected["logprobs"] = [v if math.isfinite(v) else None for v in expected["logprobs"]]
            assert {key: item[key] for key in expected} == expected, stored
            assert list(item)[: len(trajectory_json(row))] == list(trajectory_json(row))  # the same key order
            assert item["feed_position"] > 0 and item["group_size"] == 2
        assert items[str(first)]["routed_experts"] is not None and items[str(second)]["routed_experts"] is None
        served = items[str(first)]["logprobs"]
        assert [numpy.float32(v) for v in served[:-2]] == [numpy.float32(v) for v in logprobs[:-2]]
        assert served[-2:] == [None, None]  # no number: null, as orjson writes -inf and NaN
        with services.db.unit() as db:
            db.execute(sa.text("SET LOCAL session_replication_role = replica"))  # no trigger: as before 0019
            db.execute(sa.update(Trajectory).values(feed_json=None))


@pytest.fixture
def sqlite_services(tmp_path: Path) -> Iterator[Services]:
    """Embedded mode's database, whose feed builds each item's JSON in Python."""
    url = f"sqlite:///{tmp_path}/polar.db"
    upgrade(url)
    services = domain_services(url, tmp_path, ready_buffer=100)
    yield services
    services.db.dispose()


@pytest.mark.parametrize("database", ["postgres", "sqlite"])
def test_items_and_session_trajectories_say_which_are_the_main_chain(
    database: str, request: pytest.FixtureRequest
) -> None:
    """A call of the session that continues nothing of its agent's (another opening: a tool's own use of the key)
    is its own trajectory, served with ``main: false``; the session's main chain with ``main: true``."""
    services = request.getfixturevalue("services" if database == "postgres" else "sqlite_services")
    batch = submit(services, command_task("merged", "true", reconstruction="prefix_merging"),
                   command_task("per-call", "true"))  # fmt: skip
    merged, per_call = queued_sessions(services)
    sent = services.dispatcher.sent  # type: ignore[attr-defined]
    while sent:
        stage, queued = sent.pop(0)
        if stage is Stage.POSTRUN:
            with services.db.unit() as db:
                for seq, prompt in ((1, [1, 2, 3]), (2, [9, 8, 7]), (3, [1, 2, 3, 4, 5, 6])):
                    db.add(ModelCall(session_id=queued, seq=seq, provider="openai_chat", stream=False,
                                     prompt_token_ids=prompt, completion_token_ids=[4, 5], logprobs=[-0.1, -0.2],
                                     finish_reason="stop", status_code=200, latency_ms=1.0, request={},
                                     normalized_request={}, response={}))  # fmt: skip
        STAGE_FUNCTIONS[stage](services, queued)
    items: dict[str, list[tuple[int, bool]]] = {}
    for item in read_feed(services, batch, after=0, limit=10).items:
        items.setdefault(item["task_id"], []).append((len(item["call_ids"]), item["main"]))
    assert items == {"merged": [(2, True), (1, False)], "per-call": [(1, True), (1, False), (1, True)]}
    assert [t["main"] for t in session_trajectories(services, merged)] == [True, False]
    assert [t["main"] for t in session_trajectories(services, per_call)] == [True, False, True]


def test_informative_pages_leave_out_groups_whose_rewards_do_not_vary(services: Services) -> None:
    batch = submit(services, command_task("mixed", "true", samples=2), command_task("flat", "true", samples=2))
    sessions = queued_sessions(services)
    finish(services, set(sessions))
    with services.db.unit() as db:  # one sample of "mixed" scored 0: its group has an advantage to train on
        db.execute(sa.update(Session).where(Session.id == sessions[1]).values(reward=0.0))
    every = read_feed(services, batch, after=0, limit=10, groups=True)
    assert len({item["group_id"] for item in every.items}) == 2 and every.skipped_uninformative == 0
    page = read_feed(services, batch, after=0, limit=10, groups=True, informative=True)
    assert {item["task_id"] for item in page.items} == {"mixed"}
    assert page.skipped_uninformative == 1 and page.next_cursor == every.next_cursor  # the cursor moves past it
    # One group a page: the mixed group's two items, or the flat group left out, and the cursor past it either way.
    one = read_feed(services, batch, after=0, limit=1, groups=True, informative=True)
    assert one.next_cursor > 0 and len(one.items) + 2 * one.skipped_uninformative == 2
