"""GRPO groups: the n samples of one task. The feed and the exports name a group the same way, and the feed says
how much of each group a trainer can use (``group_standing``).

A group's baseline must hold only scored samples: each sample counts once, by its latest attempt (a retried
sample's next attempt takes its place), and only an attempt with a task outcome is scored. The others are missing,
each for one reason:

- ``cancelled``: the batch was cancelled before the sample was scored;
- ``out_of_attempts``: its last allowed attempt was lost to the infrastructure;
- ``no_model_calls``: its attempt ended without one answered model call (``excluded``: the policy never acted);
- ``pending``: it has not settled yet (queued, running, or a retry of a lost attempt on its way).
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session as DbSession

from polar.lifecycle.attempts import OutcomeClass, is_latest_attempt
from polar.storage.models import Session

CANCELLED = "cancelled"
OUT_OF_ATTEMPTS = "out_of_attempts"
NO_MODEL_CALLS = "no_model_calls"
PENDING = "pending"


def group_id(batch_id: uuid.UUID | str, task_position: int, metadata: Mapping[str, Any] | None) -> str:
    """The task's ``metadata.group_id`` when the submitter set one, else ``"<batch_id>:<task position>"``."""
    explicit = (metadata or {}).get("group_id")
    return str(explicit) if explicit is not None else f"{batch_id}:{task_position}"


@dataclass(frozen=True)
class GroupStanding:
    """How many of a group's samples are scored, and why each of the others is missing (reason -> count; empty
    when every sample is scored)."""

    scored: int = 0
    missing: dict[str, int] = field(default_factory=dict)


def _reason(outcome_class: str | None, settled: bool) -> str | None:
    """Why a sample whose latest attempt is this is missing from its group's baseline; None: it is scored."""
    if not settled:
        return PENDING
    if outcome_class == OutcomeClass.TASK.value:
        return None
    if outcome_class == OutcomeClass.EXCLUDED.value:
        return NO_MODEL_CALLS
    return CANCELLED if outcome_class == OutcomeClass.CANCELLED.value else OUT_OF_ATTEMPTS


def group_standing(db: DbSession, task_pks: Collection[uuid.UUID]) -> dict[uuid.UUID, GroupStanding]:
    """Each task's group as it stands now, by its samples' latest attempts (one statement)."""
    if not task_pks:
        return {}
    settled = Session.feed_seq.is_not(None)
    rows = db.execute(
        sa.select(Session.task_pk, Session.outcome_class, settled.label("settled"), sa.func.count())
        .where(Session.task_pk.in_(list(task_pks)), is_latest_attempt())
        .group_by(Session.task_pk, Session.outcome_class, settled)
    ).all()
    scored: dict[uuid.UUID, int] = {}
    missing: dict[uuid.UUID, dict[str, int]] = {}
    for task_pk, outcome_class, is_settled, count in rows:
        reason = _reason(outcome_class, bool(is_settled))
        if reason is None:
            scored[task_pk] = scored.get(task_pk, 0) + int(count)
        else:
            reasons = missing.setdefault(task_pk, {})
            reasons[reason] = reasons.get(reason, 0) + int(count)
    return {pk: GroupStanding(scored.get(pk, 0), dict(sorted(missing.get(pk, {}).items()))) for pk in task_pks}
