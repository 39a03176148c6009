"""Batches at a glance: the list of batches, newest first, and one batch broken down per task and per node.

Each sample counts once, by its latest attempt (as in ``polar.lifecycle.batches``). A finished sample is
*accepted* when it has a reward and the reward is positive, or at least ``min_reward`` when one is given (the same
threshold an export's ``min_reward`` applies): the acceptance rate is accepted / finished. The reward an excluded
attempt keeps for the record (no model call answered: ``polar.lifecycle.attempts``) is no reward here.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from polar.contract.states import TERMINAL, State
from polar.errors import NotFound
from polar.lifecycle.attempts import OutcomeClass, is_latest_attempt
from polar.lifecycle.batches import overall_status
from polar.services import Services
from polar.storage.models import Batch, Session, Task
from polar.storage.serialization import batch_json

STATES: tuple[str, ...] = tuple(state.value for state in State)  # pipeline order: pending … cancelled
UNASSIGNED = "(no node yet)"


@dataclass(frozen=True)
class Histogram:
    """``counts[i]`` values fell in ``[low + i * width, low + (i + 1) * width)`` (the last bin includes ``high``)."""

    low: float
    high: float
    counts: tuple[int, ...]

    @property
    def width(self) -> float:
        return (self.high - self.low) / len(self.counts)

    def bins(self) -> list[tuple[float, float, int]]:
        """``(start, end, count)`` per bin."""
        return [(self.low + i * self.width, self.low + (i + 1) * self.width, n) for i, n in enumerate(self.counts)]


def histogram(values: Sequence[float], bins: int = 10) -> Histogram | None:
    """Equal-width bins over [0, 1] when every value is in it (most rewards), else over the values' range; None
    without finite values."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return None
    low, high = min(finite), max(finite)
    if low >= 0.0 and high <= 1.0:
        low, high = 0.0, 1.0
    elif low == high:
        low, high = low - 0.5, high + 0.5
    counts = [0] * bins
    width = (high - low) / bins
    for value in finite:
        counts[min(int((value - low) / width), bins - 1)] += 1
    return Histogram(low, high, tuple(counts))


def _accepted(reward: float | None, min_reward: float | None) -> bool:
    if reward is None or not math.isfinite(reward):
        return False
    return reward > 0 if min_reward is None else reward >= min_reward


def _rate(part: int, whole: int) -> float | None:
    return part / whole if whole else None


@dataclass(frozen=True)
class TaskSummary:
    task_id: str
    position: int
    num_samples: int
    counts: dict[str, int]
    rewards: tuple[float, ...]  # of the finished samples that have one
    finished: int
    accepted: int
    histogram: Histogram | None

    @property
    def mean_reward(self) -> float | None:
        finite = [r for r in self.rewards if math.isfinite(r)]
        return sum(finite) / len(finite) if finite else None

    @property
    def acceptance_rate(self) -> float | None:
        return _rate(self.accepted, self.finished)


@dataclass(frozen=True)
class BatchOverview:
    tasks: tuple[TaskSummary, ...]
    nodes: dict[str, dict[str, int]]  # node -> state -> samples (a pending sample has no node yet)
    min_reward: float | None
    finished: int = 0
    accepted: int = 0
    histogram: Histogram | None = field(default=None)

    @property
    def acceptance_rate(self) -> float | None:
        return _rate(self.accepted, self.finished)


def list_batches(services: Services, limit: int, offset: int) -> dict[str, Any]:
    """A page of batches, newest first, each as the API shows it (``batch_json``: status and counts per state)."""
    with services.db.unit() as db:
        total = int(db.scalar(sa.select(sa.func.count()).select_from(Batch)) or 0)
        batches = db.scalars(
            sa.select(Batch).order_by(Batch.created_at.desc(), Batch.id.desc()).limit(limit).offset(offset)
        ).all()
        ids = [batch.id for batch in batches]
        counts: dict[uuid.UUID, dict[str, int]] = {batch_id: {} for batch_id in ids}
        retried: dict[uuid.UUID, int] = {}
        if ids:
            in_page = Session.batch_id.in_(ids)
            rows = db.execute(
                sa.select(Session.batch_id, Session.state, sa.func.count())
                .where(in_page, is_latest_attempt())
                .group_by(Session.batch_id, Session.state)
            ).all()
            for batch_id, state, count in rows:
                counts[batch_id][state] = int(count)
            lost = (Session.outcome_class == OutcomeClass.INFRASTRUCTURE.value) & Session.retried_as.is_not(None)
            retried_rows = db.execute(
                sa.select(Session.batch_id, sa.func.count()).where(in_page, lost).group_by(Session.batch_id)
            ).all()
            retried = {batch_id: int(count) for batch_id, count in retried_rows}
    items = [
        batch_json(batch, overall_status(batch.num_sessions, counts[batch.id], retried.get(batch.id, 0)),
                   counts[batch.id])
        for batch in batches
    ]  # fmt: skip
    next_offset = offset + len(items)
    return {"items": items, "total": total, "next_offset": next_offset if next_offset < total else None}


def batch_overview(services: Services, batch_id: uuid.UUID, min_reward: float | None = None) -> BatchOverview:
    """Per task: samples per state, rewards, acceptance and a reward histogram; per node: samples per state."""
    with services.db.unit() as db:
        if db.get(Batch, batch_id) is None:
            raise NotFound(f"batch {batch_id} not found")
        tasks = db.execute(
            sa.select(Task.id, Task.task_id, Task.position, Task.num_samples)
            .where(Task.batch_id == batch_id)
            .order_by(Task.position)
        ).all()
        served_reward = sa.case((Session.outcome_class == OutcomeClass.EXCLUDED.value, None), else_=Session.reward)
        samples = db.execute(
            sa.select(Session.task_pk, Session.state, served_reward.label("reward"), Session.node).where(
                Session.batch_id == batch_id, is_latest_attempt()
            )
        ).all()
    per_task: dict[uuid.UUID, list[Any]] = {task.id: [] for task in tasks}
    nodes: dict[str, dict[str, int]] = {}
    for sample in samples:
        per_task.setdefault(sample.task_pk, []).append(sample)
        by_state = nodes.setdefault(sample.node or UNASSIGNED, {})
        by_state[sample.state] = by_state.get(sample.state, 0) + 1
    summaries = tuple(_summary(task, per_task[task.id], min_reward) for task in tasks)
    every_reward = [reward for summary in summaries for reward in summary.rewards]
    return BatchOverview(
        tasks=summaries,
        nodes=dict(sorted(nodes.items())),
        min_reward=min_reward,
        finished=sum(summary.finished for summary in summaries),
        accepted=sum(summary.accepted for summary in summaries),
        histogram=histogram(every_reward),
    )


def _summary(task: Any, samples: list[Any], min_reward: float | None) -> TaskSummary:
    counts: dict[str, int] = {}
    for sample in samples:
        counts[sample.state] = counts.get(sample.state, 0) + 1
    finished = [sample for sample in samples if sample.state in TERMINAL]
    rewards = tuple(float(s.reward) for s in finished if s.reward is not None)
    return TaskSummary(
        task_id=task.task_id,
        position=task.position,
        num_samples=task.num_samples,
        counts=counts,
        rewards=rewards,
        finished=len(finished),
        accepted=sum(_accepted(sample.reward, min_reward) for sample in finished),
        histogram=histogram(rewards),
    )
