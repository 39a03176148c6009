"""Attempts: a sample (task, ``sample_index``) runs as one or more sessions, one per attempt.

Every way an attempt can end has one class, and the class says what follows (docs/training-data.md, "Outcomes"):

- *task* (``exited``, ``timeout``): the policy's doing. The evaluator scores it, and a verifier the work broke,
  hung or tampered with scores the task's ``failure_reward`` (0.0 unless set), never None. The only class served
  to trainers: the feed, the groups, the exports and the reward views.
- *excluded*: a task outcome whose harness ended without one answered model call (no delivered 200): the policy
  never acted, so its reward measures nothing of it. Still evaluated and its reward stored, for the record; never
  retried, never served; its group counts the sample as missing (``no_model_calls``).
- *infrastructure* (``worker_lost``, ``node_lost``, ``runtime_failed``, ``engine_failed``, ``queue_timeout``,
  ``prepare_failed``, ``init_timeout``, ``unscorable``, ``error``): an accident of the machinery, including a
  preparation that failed or ran out of time before the harness started (the policy never ran) and an evaluator
  whose own code failed (``unscorable``). It starts the next attempt of the same sample, up to the task's
  ``max_attempts``; the lost attempt stays in Postgres with its calls for audit and is never training data.
- *cancelled* (``cancelled``): the batch was cancelled. Never scored (the evaluator does not run), never served.

A sample is *settled* when an attempt ended with a task outcome (excluded or not), when it was cancelled, or when
its last allowed attempt was lost (reported on the batch as out of attempts): its GRPO group counts it as done in
each case, but only the task class carries data.

    classify(Outcome.WORKER_LOST)                    -> OutcomeClass.INFRASTRUCTURE
    classify(Outcome.CANCELLED)                      -> OutcomeClass.CANCELLED
    class_of(Outcome.EXITED, acted=0)                -> OutcomeClass.EXCLUDED
    paused = Disruption("proxy", "paused", count=1, last_at=t1)          # a weight-sync pause's 429
    refine(Outcome.EXITED, 1, CallEvidence(last_answer_at=t0, disruptions=(paused,)), False)
                                                     -> Outcome.ENGINE_FAILED   (t1 >= t0: nothing answered after)
    refine(Outcome.EXITED, 1, CallEvidence(last_answer_at=t2, disruptions=(paused,)), False)
                                                     -> Outcome.EXITED          (t2 > t1: the harness recovered)
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Literal

import sqlalchemy as sa
from sqlalchemy.orm import Session as DbSession

from polar.clock import as_utc, utcnow
from polar.contract.states import Outcome, State
from polar.contract.task_request import DEFAULT_MAX_ATTEMPTS
from polar.errors import GENERATION_TIMEOUT
from polar.lifecycle.transitions import record_event
from polar.services import Services
from polar.storage.models import Session

__all__ = [
    "DEFAULT_MAX_ATTEMPTS",
    "CallEvidence",
    "Disruption",
    "OutcomeClass",
    "class_of",
    "classify",
    "is_latest_attempt",
    "is_training_signal",
    "refine",
    "retries_left",
    "start_next_attempt",
]


class OutcomeClass(StrEnum):
    TASK = "task"  # scored; training signal
    EXCLUDED = "excluded"  # a task outcome without one answered model call: the policy never acted; never served
    INFRASTRUCTURE = "infrastructure"  # retried; never training data
    CANCELLED = "cancelled"  # never scored, never served


_CLASS: dict[Outcome, OutcomeClass] = {
    Outcome.EXITED: OutcomeClass.TASK,
    Outcome.TIMEOUT: OutcomeClass.TASK,
    Outcome.CANCELLED: OutcomeClass.CANCELLED,
    Outcome.WORKER_LOST: OutcomeClass.INFRASTRUCTURE,
    Outcome.NODE_LOST: OutcomeClass.INFRASTRUCTURE,
    Outcome.RUNTIME_FAILED: OutcomeClass.INFRASTRUCTURE,
    Outcome.ENGINE_FAILED: OutcomeClass.INFRASTRUCTURE,
    Outcome.QUEUE_TIMEOUT: OutcomeClass.INFRASTRUCTURE,
    Outcome.PREPARE_FAILED: OutcomeClass.INFRASTRUCTURE,
    Outcome.INIT_TIMEOUT: OutcomeClass.INFRASTRUCTURE,
    Outcome.UNSCORABLE: OutcomeClass.INFRASTRUCTURE,
    Outcome.ERROR: OutcomeClass.INFRASTRUCTURE,
}


def is_training_signal() -> sa.ColumnElement[bool]:
    """SQL: the session ended with a task outcome the policy acted in: neither excluded (no model call answered),
    lost to the infrastructure nor cancelled (the feed, the exports and the reward views serve only these)."""
    return Session.outcome_class == OutcomeClass.TASK.value


def is_latest_attempt() -> sa.ColumnElement[bool]:
    """SQL: the session is its sample's latest attempt (each sample counts once in progress and groups)."""
    return Session.retried_as.is_(None)


def classify(outcome: Outcome) -> OutcomeClass:
    """Whether ``outcome`` is training signal (task), an accident of the machinery (infrastructure) or a cancel."""
    return _CLASS[outcome]


def class_of(outcome: Outcome, acted: int) -> OutcomeClass:
    """The class an ended attempt is stored under: ``classify``'s, except that a task outcome in which the policy
    never acted is ``EXCLUDED``. ``acted`` counts the calls it acted in: its delivered answers (200s, synthesized
    stops not counted) and the calls it was still generating when the engine timeout ran out (``generation_timeout``:
    its own doing, so a policy cannot turn its zero into a missing sample by never finishing an answer)."""
    found = classify(outcome)
    return OutcomeClass.EXCLUDED if found is OutcomeClass.TASK and acted == 0 else found


@dataclass(frozen=True)
class Disruption:
    """Calls of the harness of one kind that the infrastructure failed or turned away: the engine failed them
    (``kind``: ``polar.errors``' failure kinds, None on calls recorded before kinds were), or the proxy refused them
    (``kind``: the reason, ``paused`` or ``database_outage``); how many, and when the last was (the database's
    clock, ``polar.proxy.refusals`` for refusals counted while it was away)."""

    source: Literal["engine", "proxy"]
    kind: str | None
    count: int
    last_at: datetime

    @property
    def counts(self) -> bool:
        """Whether this is the infrastructure's doing: all are, except a call that was still generating on a
        healthy engine when the engine timeout ran out (``generation_timeout``: the policy asked for that much)."""
        return not (self.source == "engine" and self.kind == GENERATION_TIMEOUT)

    def describe(self) -> str:
        kind = f" ({self.kind})" if self.kind else ""
        if self.source == "engine":
            return f"the engine failed {self.count} of the harness's calls{kind}"
        return f"the proxy refused {self.count} of its calls{kind}"


@dataclass(frozen=True)
class CallEvidence:
    """What postrun knows of the harness's calls when it judges the attempt: when its last delivered answer was
    recorded (a 200 that reached it, Polar's own stop answers aside; None: it never had one) and the disruptions
    it met (refusals under the task's own call limits are not among them: running out of calls is the policy's
    doing)."""

    last_answer_at: datetime | None = None
    disruptions: Sequence[Disruption] = ()

    def unrecovered(self) -> list[Disruption]:
        """The disruptions that count and that no delivered answer came after: the last of their kind was at or
        after the harness's last answer, or it never had one."""
        answered = self.last_answer_at
        return [
            d for d in self.disruptions
            if d.counts and d.count > 0 and (answered is None or _utc(d.last_at) >= _utc(answered))
        ]  # fmt: skip

    def generation_timeouts(self) -> int:
        """The calls still generating on a healthy engine when the engine timeout ran out: the policy acted in them."""
        return sum(d.count for d in self.disruptions if not d.counts)

    def explained(self) -> str:
        """What the infrastructure did that the harness did not recover from, for the attempt's error."""
        why = "; ".join(d.describe() for d in self.unrecovered())
        if self.last_answer_at is None:
            return f"{why}, and the harness never had an answer"
        return f"{why}, the last of them at or after the harness's last answer"


def _utc(moment: datetime) -> datetime:
    return as_utc(moment) or moment


def refine(outcome: Outcome, exit_code: int | None, evidence: CallEvidence, evaluator_runtime_failed: bool) -> Outcome:
    """The outcome postrun records, once it knows what happened around the harness:

    - a harness that failed (a nonzero exit) or ran out of time is the infrastructure's loss, ``ENGINE_FAILED``,
      only when the infrastructure plausibly caused it: the engine failed one of its calls (unreachable, 5xx,
      timed out while unhealthy or queueing) or the proxy refused one because of the infrastructure (a
      weight-sync pause, a database outage: ``polar.proxy.refusals``) at or after its last delivered answer, or
      it had no delivered answer at all (``CallEvidence.unrecovered``). A disruption the harness recovered from
      (an answer came after it) leaves a later failure the policy's, and so does a call still generating on a
      healthy engine when the engine timeout ran out (``generation_timeout``). One that exited 0 recovered by
      itself, and a cancel stays a cancel;
    - an evaluator whose runtime broke under it (not one that judged the work bad) could not score the attempt:
      ``RUNTIME_FAILED``.
    """
    if evaluator_runtime_failed and classify(outcome) is OutcomeClass.TASK:
        return Outcome.RUNTIME_FAILED
    failed = (outcome is Outcome.EXITED and exit_code != 0) or outcome is Outcome.TIMEOUT
    if failed and evidence.unrecovered():
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
            priority=ended.priority,
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
