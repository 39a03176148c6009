"""Attempts: a sample (task, ``sample_index``) runs as one or more sessions, one per attempt.

An attempt ends with a *task* outcome, which is training signal (the harness exited, ran out of budget, was
cancelled, the task's own prepare step failed; the evaluator scores it), or an *infrastructure* outcome, which
is not (a worker or a whole node lost, a runtime that could not be created or vanished, the engine failing the
harness's calls, the budget spent waiting for a run slot before the harness ever started, Polar's own error).
An infrastructure outcome starts the next attempt of the same sample, up to the task's ``max_attempts``; the lost
attempt stays in Postgres with its calls for audit and is left out of the feed, group completeness, the exports
and the reward views.

A sample is *settled* when an attempt ended with a task outcome, or when its last allowed attempt was lost
(reported on the batch as out of attempts): its GRPO group counts it as done either way, but only task
outcomes carry data.

    classify(Outcome.WORKER_LOST)                    -> OutcomeClass.INFRASTRUCTURE
    refine(Outcome.EXITED, exit_code=1, engine_failures=2, evaluator_runtime_failed=False)
                                                     -> Outcome.ENGINE_FAILED
"""

from __future__ import annotations

import uuid
from enum import StrEnum

import sqlalchemy as sa
from sqlalchemy.orm import Session as DbSession

from polar.clock import utcnow
from polar.lifecycle.states import Outcome, State
from polar.lifecycle.transitions import record_event
from polar.services import Services
from polar.storage.models import Session
from polar.task_request import DEFAULT_MAX_ATTEMPTS

__all__ = [
    "DEFAULT_MAX_ATTEMPTS",
    "OutcomeClass",
    "classify",
    "is_latest_attempt",
    "is_training_signal",
    "refine",
    "retries_left",
    "start_next_attempt",
]


class OutcomeClass(StrEnum):
    TASK = "task"
    INFRASTRUCTURE = "infrastructure"


_CLASS: dict[Outcome, OutcomeClass] = {
    Outcome.EXITED: OutcomeClass.TASK,
    Outcome.TIMEOUT: OutcomeClass.TASK,
    Outcome.CANCELLED: OutcomeClass.TASK,
    Outcome.PREPARE_FAILED: OutcomeClass.TASK,
    Outcome.WORKER_LOST: OutcomeClass.INFRASTRUCTURE,
    Outcome.NODE_LOST: OutcomeClass.INFRASTRUCTURE,
    Outcome.RUNTIME_FAILED: OutcomeClass.INFRASTRUCTURE,
    Outcome.ENGINE_FAILED: OutcomeClass.INFRASTRUCTURE,
    Outcome.QUEUE_TIMEOUT: OutcomeClass.INFRASTRUCTURE,
    Outcome.ERROR: OutcomeClass.INFRASTRUCTURE,
}


def is_training_signal() -> sa.ColumnElement[bool]:
    """SQL: the session is not an attempt lost to the infrastructure (the feed, exports and views use this)."""
    return Session.outcome_class.is_distinct_from(OutcomeClass.INFRASTRUCTURE.value)


def is_latest_attempt() -> sa.ColumnElement[bool]:
    """SQL: the session is its sample's latest attempt (each sample counts once in progress and groups)."""
    return Session.retried_as.is_(None)


def classify(outcome: Outcome) -> OutcomeClass:
    """Whether ``outcome`` is training signal (task) or an accident of the machinery (infrastructure)."""
    return _CLASS[outcome]


def refine(
    outcome: Outcome,
    exit_code: int | None,
    engine_failures: int,
    evaluator_runtime_failed: bool,
    infrastructure_refusals: int = 0,
) -> Outcome:
    """The outcome postrun records, once it knows what happened around the harness:

    - a harness that failed or ran out of time after the engine failed some of its calls (unreachable, 5xx,
      timed out), or after the proxy refused some because of the infrastructure (a weight-sync pause, a
      database outage: ``polar.proxy.refusals``), failed because of the engine: ``ENGINE_FAILED``. One that
      exited 0 recovered by itself, and a cancel stays a cancel; refusals under the task's own call limits are
      not counted here (running out of calls is the policy's doing);
    - an evaluator whose runtime broke under it (not one that judged the work bad) could not score the attempt:
      ``RUNTIME_FAILED``.
    """
    if evaluator_runtime_failed and classify(outcome) is OutcomeClass.TASK and outcome is not Outcome.CANCELLED:
        return Outcome.RUNTIME_FAILED
    failed = (outcome is Outcome.EXITED and exit_code != 0) or outcome is Outcome.TIMEOUT
    if failed and engine_failures + infrastructure_refusals > 0:
        return Outcome.ENGINE_FAILED
    return outcome


def retries_left(attempt: int, max_attempts: int) -> bool:
    """True when an attempt lost to the infrastructure may be followed by another."""
    return attempt < max_attempts


def start_next_attempt(db: DbSession, ended: Session, by: Services, reason: str) -> uuid.UUID:
    """Inside the lost attempt's terminal transaction: a new pending session for the same sample (same task and
    ``sample_index``, ``attempt`` + 1), linked both ways; returns its id."""
    retry_id = uuid.uuid4()
    now = utcnow()
    db.execute(
        sa.insert(Session).values(
            id=retry_id,
            batch_id=ended.batch_id,
            task_pk=ended.task_pk,
            task_id=ended.task_id,
            task_position=ended.task_position,
            sample_index=ended.sample_index,
            attempt=ended.attempt + 1,
            state=State.PENDING.value,
            retry_of=ended.id,
            created_at=now,
        )
    )
    db.execute(sa.update(Session).where(Session.id == ended.id).values(retried_as=retry_id))
    detail = f"attempt {ended.attempt + 1}: attempt {ended.attempt} ({ended.id}) was lost to {reason}"
    record_event(db, retry_id, None, State.PENDING, by, detail, now)
    return retry_id
