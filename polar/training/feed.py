"""The trainers' feed (``GET /v1/trajectories``): finished sessions' trajectories, in the order sessions ended,
behind a cursor; optionally only whole groups (all n samples of a task settled).

The cursor is ``sessions.feed_seq``, assigned in postrun's terminal transaction under a lock, so positions are
handed out in commit order: a reader that has seen position p can never later find a session below p appear.

Only *settled* samples get a position (``polar.lifecycle.attempts``): an attempt with a task outcome (excluded
or not), a cancelled one, or a last attempt lost to the infrastructure. Attempts that were retried never appear,
and a sample that was cancelled, ran out of attempts or was excluded (no model call answered) completes its group
without contributing trajectories: the feed carries the task class only. Each item says how its group stands
(``polar.lifecycle.groups``): ``group_scored`` samples scored, and ``group_missing``, why each of the others is
missing (reason -> count; empty when the whole group is scored).

With ``informative``, a page of whole groups leaves out each group whose scored samples' rewards are all equal
(one sample, all right, all wrong): in GRPO-style training every advantage of such a group is zero and it trains
nothing, however long it took to roll out. The page says how many it left out (``skipped_uninformative``), and its
cursor moves past them.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Collection, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.orm import Session as DbSession

from polar.codec.json_body import dump_json_text
from polar.codec.wait_slots import WaitSlots
from polar.contract.states import TERMINAL
from polar.errors import Busy
from polar.lifecycle.attempts import OutcomeClass
from polar.lifecycle.groups import group_id, group_standing
from polar.services import Services
from polar.storage.calls.read import routed_experts_of_sessions
from polar.storage.columns import any_of, is_postgres
from polar.storage.locks import FEED, exclusive
from polar.storage.models import Session, Task, Trajectory
from polar.storage.serialization import routed_json, stored_trajectory_json

POLL_S = 0.2
_CHUNK = 1000  # tasks per statement when completing groups
_TERMINAL = [state.value for state in TERMINAL]


@dataclass(frozen=True)
class FeedPage:
    """A page of the feed: each item's JSON text, written as it is into the API's answer (``fragments``), or read
    back into dicts (``items``)."""

    texts: list[str]
    next_cursor: int
    skipped_uninformative: int = 0  # whole groups left out for rewards without variance (``informative``)

    @property
    def items(self) -> list[dict[str, Any]]:
        return [orjson.loads(text) for text in self.texts]

    @property
    def fragments(self) -> list[orjson.Fragment]:
        """The items as orjson embeds already-serialised JSON (Flask's JSON provider here is orjson)."""
        return [orjson.Fragment(text) for text in self.texts]


def assign_position(db: DbSession, session_id: uuid.UUID) -> None:
    """Give a session that just ended the next feed position (inside its terminal transaction)."""
    assign_positions(db, [session_id])


def assign_positions(
    db: DbSession, session_ids: Sequence[uuid.UUID], task_pks: Collection[uuid.UUID] | None = None
) -> None:
    """Give sessions that just ended the next feed positions, in the order given, in one statement however many
    there are, and each group they complete its position (``tasks.group_feed_seq``: the position of its last
    sample). ``task_pks``: the sessions' tasks, when the caller has them (a cancel of 100,000 sessions does)."""
    if not session_ids:
        return
    last = lock_positions(db)
    table = Session.__table__
    if db.get_bind().dialect.name == "postgresql":
        numbered = (
            sa.func.unnest(sa.bindparam("ids", type_=postgresql.ARRAY(sa.Uuid())))
            .table_valued("id", with_ordinality="n")
            .render_derived("numbered")
        )
        db.execute(
            sa.update(table).where(table.c.id == numbered.c.id).values(feed_seq=sa.bindparam("last") + numbered.c.n),
            {"ids": list(session_ids), "last": last},
        )
    else:
        db.execute(
            sa.update(table).where(table.c.id == sa.bindparam("sid")).values(feed_seq=sa.bindparam("seq")),
            [{"sid": session_id, "seq": last + offset} for offset, session_id in enumerate(session_ids, start=1)],
        )
    if task_pks is None:
        task_pks = db.scalars(sa.select(Session.task_pk).where(Session.id.in_(session_ids)).distinct()).all()
    complete_groups(db, task_pks)


def lock_positions(db: DbSession) -> int:
    """Take the feed lock (until the transaction ends) and return the last position handed out: the positions
    above it are this transaction's to give."""
    exclusive(db, FEED)
    return int(db.scalar(sa.select(sa.func.coalesce(sa.func.max(Session.feed_seq), 0))) or 0)


def complete_groups(db: DbSession, task_pks: Collection[uuid.UUID]) -> None:
    """Mark each of these tasks whose samples have all settled with its group's position. Runs under the feed
    lock, so two samples of one group ending at once cannot both miss completing it."""
    tasks = list(task_pks)
    for start in range(0, len(tasks), _CHUNK):
        chunk = tasks[start : start + _CHUNK]
        settled = (
            sa.select(Session.task_pk, sa.func.max(Session.feed_seq).label("position"), sa.func.count().label("n"))
            .where(Session.task_pk.in_(chunk), Session.feed_seq.is_not(None))
            .group_by(Session.task_pk)
            .subquery()
        )
        db.execute(
            sa.update(Task)
            .where(Task.id == settled.c.task_pk, Task.num_samples == settled.c.n, Task.group_feed_seq.is_(None))
            .values(group_feed_seq=settled.c.position)
        )


def _sessions_after(db: DbSession, batch_id: uuid.UUID | None, after: int, limit: int, groups: bool) -> list[Any]:
    scope = [Session.feed_seq.is_not(None)] + ([Session.batch_id == batch_id] if batch_id else [])
    if not groups:
        query = sa.select(Session.id, Session.feed_seq).where(*scope, Session.feed_seq > after)
        return list(db.execute(query.order_by(Session.feed_seq).limit(limit)).all())
    # A group's position is that of its last session to settle (``assign_positions``); it appears only then.
    chosen = (
        sa.select(Task.id, Task.group_feed_seq.label("position"))
        .where(Task.group_feed_seq > after, *([Task.batch_id == batch_id] if batch_id else []))
        .order_by(Task.group_feed_seq)
        .limit(limit)
        .subquery()
    )
    query = (
        sa.select(Session.id, chosen.c.position, Session.task_pk, Session.reward, Session.outcome_class)
        .join(chosen, chosen.c.id == Session.task_pk)
        .where(Session.feed_seq.is_not(None))
    )
    return list(db.execute(query.order_by(chosen.c.position, Session.sample_index)).all())


def _informative(rows: Sequence[Any]) -> tuple[list[Any], int]:
    """The rows of the groups whose scored samples' rewards differ, and how many groups were left out."""
    rewards: dict[Any, set[float]] = {}
    for row in rows:
        scored = row.outcome_class == OutcomeClass.TASK.value and row.reward is not None
        rewards.setdefault(row.task_pk, set()).update([row.reward] if scored else [])
    flat = {task for task, values in rewards.items() if len(values) < 2}
    return [row for row in rows if row.task_pk not in flat], len(flat)


# What an item says of its session, read in the same statement as the session's trajectories.
_SESSION_FIELDS = (Session.batch_id, Session.task_id, Session.task_pk, Session.sample_index, Session.attempt,
                   Session.state)  # fmt: skip
_TRAJECTORIES = Trajectory.__table__
# On Postgres, a trajectory's part of its item (``serialization.stored_trajectory_json``: its row, no expert
# routing) is JSON text the database wrote when the row was (``trajectories.feed_json``, by ``polar_trajectory_json``
# in a trigger of migration 0019): a page of 10 groups holds ~600,000 array elements, which psycopg parsed into Python
# lists and the API serialised back (~100 ms a page), and which ``json_build_object`` writes in ~65 ms. Rows stored
# before 0019 have none: the same function builds it for them here. A float4 logprob prints as its shortest decimal,
# the text psycopg parses into the float the Python path writes (0.0 prints as 0: a number either way); one that is no
# number (-Infinity, NaN) prints null, as orjson writes it.
_TRAJECTORY_JSON = sa.func.coalesce(
    _TRAJECTORIES.c.feed_json, sa.func.polar_trajectory_json(sa.literal_column("trajectories"))
).label("trajectory_json")


def read_feed(
    services: Services,
    batch_id: uuid.UUID | None,
    after: int,
    limit: int,
    groups: bool = False,
    informative: bool = False,
) -> FeedPage:
    """One page: the trajectories of up to ``limit`` sessions (or whole groups) past ``after``; with
    ``informative`` (whole groups only), without the groups whose rewards do not vary.

    A page of 10 groups of 100 is 1,000 sessions' trajectories, so it is read as plain rows in three statements
    (the trajectories with their sessions' fields, the groups' tasks, the groups' standing) and the expert routing
    through an index of the calls that have any, never by each call's id."""
    with services.db.unit() as db:
        rows = _sessions_after(db, batch_id, after, limit, groups)
        if not rows:
            return FeedPage([], after)
        cursor, skipped = max(row[1] for row in rows), 0
        if informative:
            rows, skipped = _informative(rows)
            if not rows:
                return FeedPage([], cursor, skipped)
        postgres, session_ids = is_postgres(db), [row[0] for row in rows]
        routed = routed_experts_of_sessions(db, session_ids)
        # Call ids are read only for the expert routing (a dense model's page has none to place).
        call_ids = _TRAJECTORIES.c.call_ids if routed else sa.null().label("call_ids")
        columns = (_TRAJECTORY_JSON, _TRAJECTORIES.c.session_id, call_ids) if postgres else (_TRAJECTORIES,)
        # Cancelled, excluded and out-of-attempts samples settle their groups but carry no data.
        found = db.execute(
            sa.select(*columns, *_SESSION_FIELDS)
            .join(Session, Session.id == Trajectory.session_id)
            .where(any_of(db, Trajectory.session_id, session_ids), Session.outcome_class == OutcomeClass.TASK.value)
            .order_by(Trajectory.position)
        ).all()
        trajectories: dict[uuid.UUID, list[Any]] = {}
        for trajectory in found:
            trajectories.setdefault(trajectory.session_id, []).append(trajectory)
        task_pks = {trajectory.task_pk for trajectory in found}
        tasks = {
            task.id: task
            for task in db.execute(
                sa.select(Task.id, Task.batch_id, Task.position, Task.num_samples, Task.spec).where(
                    Task.id.in_(task_pks)
                )
            )
        }
        standing = group_standing(db, task_pks)
    # What an item says of its group, worked out once a group (a page of 10 groups holds 1,000 items).
    of_group = {
        task.id: (str(task.batch_id), group_id(task.batch_id, task.position, task.spec.get("metadata")),
                  task.num_samples, standing[task.id])
        for task in tasks.values()
    }  # fmt: skip
    texts = []
    for session_id, position, *_ in rows:
        for trajectory in trajectories.get(session_id, ()):
            batch, group, size, counts = of_group[trajectory.task_pk]
            stored = trajectory.trajectory_json if postgres else dump_json_text(stored_trajectory_json(trajectory))
            fields = dump_json_text({
                "routed_experts": routed_json(trajectory.call_ids, routed),
                "batch_id": batch,
                "task_id": trajectory.task_id,
                "sample_index": trajectory.sample_index,
                "attempt": trajectory.attempt,
                "group_id": group,
                "group_size": size,
                "group_scored": counts.scored,
                "group_missing": counts.missing,
                "state": trajectory.state,
                "feed_position": position,
            })  # fmt: skip
            texts.append(f"{stored.rstrip()[:-1]}, {fields[1:]}")  # one object: the stored part, then these
    return FeedPage(texts, cursor, skipped)


def wait_for_feed(
    services: Services,
    batch_id: uuid.UUID | None,
    after: int,
    limit: int,
    groups: bool,
    wait_s: float,
    slots: WaitSlots | None = None,
    informative: bool = False,
) -> FeedPage:
    """``read_feed``, long-polling up to ``wait_s`` seconds while there is nothing past the cursor. Waiting takes
    one of ``slots`` (None: no bound); with none free it raises ``Busy`` (a 429) instead of holding another
    thread."""
    deadline = time.monotonic() + wait_s
    page = read_feed(services, batch_id, after, limit, groups, informative)
    if page.next_cursor > after or wait_s <= 0:
        return page
    with slots.hold() if slots is not None else nullcontext(True) as held:
        if not held:
            raise Busy(
                "too many feed long-polls are waiting in this API process (POLAR_FEED_MAX_WAITERS); retry shortly",
                retry_after_s=1,
            )
        while time.monotonic() < deadline:
            time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))
            page = read_feed(services, batch_id, after, limit, groups, informative)
            if page.next_cursor > after:
                return page
    return page
