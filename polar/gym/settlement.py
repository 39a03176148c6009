"""Which of many samples have settled: one query for all of them, however many rows are waiting.

A row's sample is ``(batch_id, task_position)``: rows are submitted together, one task each.

A sample is settled when its latest attempt (``retried_as`` unset: an attempt lost to the infrastructure with
attempts left has a successor already) is terminal. Its outcome class says whether that attempt is training
signal (``task``), ended without a model call answered (``excluded``), or was the last allowed one and lost
(``infrastructure``); the calls of its trajectories outside the main chain come with it (``Settled.side_calls``), and
its segments (``Settled.segments``: which calls each holds, whether it is trainable).
"""

from __future__ import annotations

import uuid
from collections.abc import Collection
from typing import Any

import sqlalchemy as sa

from polar.contract.states import TERMINAL
from polar.gym.answers import Settled
from polar.gym.traces import SegmentCalls
from polar.lifecycle.attempts import is_latest_attempt
from polar.services import Services
from polar.storage.columns import any_of
from polar.storage.models import Session, Task, Trajectory

Sample = tuple[uuid.UUID, int]  # (batch_id, task_position)


def settled_samples(services: Services, samples: Collection[Sample]) -> dict[Sample, Settled]:
    """Those of ``samples`` that have settled, with how. The samples are matched in SQL (the batch's index leads
    with ``(batch_id, task_position)``): a poll reads the rows it answers, not every settled session of the waiting
    rows' batches with its evaluation (audit G13)."""
    if not samples:
        return {}
    wanted = sorted(set(samples))
    query = sa.select(
        Session.batch_id, Session.task_position, Session.id, Session.state, Session.outcome_class, Session.reward,
        Session.attempt, Session.error, Session.evaluation,
        Task.spec["evaluator"]["name"].as_string().label("evaluator"),
    ).join(Task, Task.id == Session.task_pk).where(
        sa.tuple_(Session.batch_id, Session.task_position).in_(wanted), is_latest_attempt(),
        Session.state.in_([str(s) for s in TERMINAL]),
    )  # fmt: skip
    with services.db.unit() as db:
        rows = db.execute(query).all()
        side, segments = _chains(db, [row.id for row in rows])
    return {
        (row.batch_id, row.task_position): Settled(row.id, row.state, row.outcome_class, row.reward, row.attempt,
                                                   row.error, row.evaluator, row.evaluation,
                                                   frozenset(side.get(row.id, ())), segments.get(row.id, ()))
        for row in rows
    }  # fmt: skip


def _chains(
    db: Any, session_ids: list[uuid.UUID]
) -> tuple[dict[uuid.UUID, set[str]], dict[uuid.UUID, tuple[SegmentCalls, ...]]]:
    """Per session, the calls of its trajectories outside the main chain, and its segments (the trajectories'
    call ids and segment records, no token arrays; per-request rows of one segment are merged)."""
    if not session_ids:
        return {}, {}
    query = sa.select(Trajectory.session_id, Trajectory.call_ids, Trajectory.main, Trajectory.segment).where(
        any_of(db, Trajectory.session_id, session_ids)
    ).order_by(Trajectory.session_id, Trajectory.position)  # fmt: skip
    side: dict[uuid.UUID, set[str]] = {}
    parts: dict[uuid.UUID, dict[int, tuple[dict[str, Any], list[str]]]] = {}
    for session_id, call_ids, main, segment in db.execute(query):
        ids = [str(call_id) for call_id in call_ids]
        if not main:
            side.setdefault(session_id, set()).update(ids)
        if segment is not None:
            parts.setdefault(session_id, {}).setdefault(int(segment["index"]), (segment, []))[1].extend(ids)
    segments = {
        session_id: tuple(
            SegmentCalls(index, segment.get("edge"), segment.get("parent"), bool(segment.get("trainable")),
                         tuple(ids), (segment.get("evidence") or {}).get("masked"))
            for index, (segment, ids) in sorted(found.items())
        )
        for session_id, found in parts.items()
    }  # fmt: skip
    return side, segments
