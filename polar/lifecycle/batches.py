"""Submitting batches and reading their progress.

A submission is validated completely before anything is written, and written in one transaction: a task with
``num_samples = n`` becomes n pending sessions (one GRPO group). ``Idempotency-Key`` replays return the batch
the first request created.

Once the transaction has committed, the batch is stored and the caller is told so, whatever happens next: admission
(moving pending sessions into ``init`` and sending their messages) is best effort after the commit. A failure
there (a database blip, a lock timeout) is logged, and the reconciler admits the pending sessions on its next pass;
answering it as a failed submission would make a caller resubmit a batch that will run anyway (AUDIT F6).
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from polar.clock import utcnow
from polar.config import Config
from polar.contract.callback_targets import check_callback_url
from polar.contract.states import TERMINAL, State
from polar.contract.task_request import BatchRequest, task_to_json
from polar.errors import Conflict, NotFound, ValidationError
from polar.evaluators import check_evaluator
from polar.harnesses.registry import check_harness
from polar.lifecycle.admission import admit_after_commit
from polar.lifecycle.attempts import OutcomeClass, is_latest_attempt
from polar.reconstruction import RECONSTRUCTIONS
from polar.records.audit import Caller, record
from polar.records.provenance import batch_provenance
from polar.runtimes import Availability, check_runtime
from polar.runtimes.copy_steps import check_task_copies
from polar.runtimes.task_images import check_task_images
from polar.services import Services
from polar.storage import db_clock
from polar.storage.locks import FEED, exclusive
from polar.storage.models import Batch, Session, SessionEvent, Task


@dataclass(frozen=True)
class Submitted:
    batch_id: uuid.UUID
    num_sessions: int
    created: bool


def request_hash(body: Any) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def with_default_runtime(request: BatchRequest, backend: str) -> BatchRequest:
    """``request`` with ``backend`` (POLAR_DEFAULT_RUNTIME) for every task that names none, as it is stored."""
    if all(task.runtime.backend for task in request.tasks):
        return request
    tasks = []
    for task in request.tasks:
        runtime = task.runtime.model_copy(update={"backend": task.runtime.backend or backend})
        tasks.append(task.model_copy(update={"runtime": runtime}))
    return request.model_copy(update={"tasks": tasks})


def _check_available(request: BatchRequest, config: Config) -> None:
    availability: Availability = {}  # each backend and image is asked about once per submission
    for index, task in enumerate(request.tasks):
        prefix = f"tasks[{index}]"
        check_runtime(task.runtime, f"{prefix}.runtime", availability)
        check_harness(task.harness, f"{prefix}.harness", config.plugin_modules)
        check_evaluator(task.evaluator, f"{prefix}.evaluator", config.plugin_modules)
        check_task_copies(task, config.copy_roots, prefix)
        check_task_images(task, config.copy_roots, config.max_image_bytes, prefix)
        if task.reconstruction not in RECONSTRUCTIONS:
            available = ", ".join(repr(name) for name in sorted(RECONSTRUCTIONS))
            raise ValidationError(
                f"{prefix}.reconstruction: {task.reconstruction!r} is not available; use one of {available}",
                field=f"{prefix}.reconstruction",
            )
    if request.callback_url is not None:
        check_callback_url(request.callback_url, config.callback_allow)


def _existing(services: Services, key: str, digest: str) -> Submitted:
    with services.db.unit() as db:
        batch = db.scalars(sa.select(Batch).where(Batch.idempotency_key == key)).one()
    if batch.request_hash != digest:
        raise Conflict(f"Idempotency-Key {key!r} was already used with a different request body")
    return Submitted(batch.id, batch.num_sessions, created=False)


def submit_batch(
    services: Services,
    request: BatchRequest,
    digest: str,
    idempotency_key: str | None = None,
    caller: Caller | None = None,
) -> Submitted:
    """Store the batch and its pending sessions, then admit what the READY buffer has room for (best effort: once
    stored, the batch is reported as stored, see the module docstring). With ``caller``
    (the API's), the batch records its submitter and the audit row is written in the same transaction; a replay of
    an ``Idempotency-Key`` starts nothing and records nothing."""
    request = with_default_runtime(request, services.config.default_runtime)
    _check_available(request, services.config)
    if idempotency_key:
        try:
            return _existing(services, idempotency_key, digest)
        except sa.exc.NoResultFound:
            pass
    # Asked before the transaction: engines answer within a short timeout, or are recorded as not answering.
    provenance = batch_provenance(services.config, services.engine_probe, request.tasks)
    batch_id = uuid.uuid4()
    now = utcnow()
    tasks = [
        {"id": uuid.uuid4(), "batch_id": batch_id, "position": position, "task_id": task.task_id,
         "num_samples": task.num_samples, "spec": task_to_json(task)}
        for position, task in enumerate(request.tasks)
    ]  # fmt: skip
    try:
        with services.db.unit() as db:
            db.add(
                Batch(
                    id=batch_id,
                    name=request.name,
                    defaults=request.defaults,
                    idempotency_key=idempotency_key,
                    request_hash=digest,
                    num_sessions=request.num_sessions,
                    callback_url=request.callback_url,
                    provenance=provenance,
                    submitted_by=caller.actor if caller else None,
                    max_consecutive_infra_losses=request.max_consecutive_infra_losses,
                )
            )
            db.flush()
            if caller is not None:
                detail = {"name": request.name, "num_sessions": request.num_sessions}
                record(db, caller.actor, "submit", str(batch_id), {**detail, "idempotency_key": idempotency_key},
                       caller.remote_addr)  # fmt: skip
            db.execute(sa.insert(Task), tasks)
            _insert_sessions(db, services, batch_id, tasks, now)
    except IntegrityError:
        if idempotency_key:  # a concurrent request with the same key won the race
            return _existing(services, idempotency_key, digest)
        raise
    admit_after_commit(services, f"batch {batch_id} is stored")
    return Submitted(batch_id, request.num_sessions, created=True)


def _insert_sessions(db: Any, services: Services, batch_id: uuid.UUID, tasks: list[dict[str, Any]], now: Any) -> None:
    """Every task's ``num_samples`` pending sessions and their first events. On Postgres, two ``INSERT ...
    SELECT`` statements build them from the task rows (100,000 sessions are two statements, not 200,000 parameter
    sets); SQLite gets the rows from here."""
    event = {"to_state": State.PENDING.value, "at": now, "worker": services.worker, "node": services.config.node,
             "detail": "submitted"}  # fmt: skip
    if db.get_bind().dialect.name == "postgresql":
        columns = ["id", "batch_id", "task_pk", "task_id", "task_position", "sample_index", "state", "created_at",
                   "priority"]  # fmt: skip
        rows = sa.select(  # a set-returning function in the select list: one row per sample
            sa.func.gen_random_uuid(), Task.batch_id, Task.id, Task.task_id, Task.position,
            sa.func.generate_series(0, Task.num_samples - 1), sa.literal(State.PENDING.value),
            sa.literal(now, sa.DateTime(timezone=True)), Task.spec["priority"].as_integer(),
        ).where(Task.batch_id == batch_id)  # fmt: skip
        db.execute(sa.insert(Session).from_select(columns, rows))
        firsts = sa.select(Session.id, *(sa.literal(value) for value in event.values())).where(
            Session.batch_id == batch_id
        )
        db.execute(sa.insert(SessionEvent).from_select(["session_id", *event], firsts))
        return
    sessions = [
        {"id": uuid.uuid4(), "batch_id": batch_id, "task_pk": task["id"], "task_id": task["task_id"],
         "task_position": task["position"], "sample_index": sample, "state": State.PENDING.value, "created_at": now,
         "priority": task["spec"]["priority"]}
        for task in tasks
        for sample in range(task["num_samples"])
    ]  # fmt: skip
    db.execute(sa.insert(Session), sessions)
    db.execute(sa.insert(SessionEvent), [{"session_id": row["id"], **event} for row in sessions])


def _counts(db: Any, batch_id: uuid.UUID) -> tuple[dict[str, int], dict[str, int]]:
    """In one pass over the batch's ``(batch_id, state)`` index: sessions per state, each sample counted once by
    its latest attempt, and the attempts the infrastructure lost (retried, and samples left without a task
    outcome: out of attempts)."""
    lost = Session.outcome_class == OutcomeClass.INFRASTRUCTURE.value
    rows = db.execute(
        sa.select(
            Session.state,
            sa.func.count().filter(is_latest_attempt()),
            sa.func.count().filter(lost, Session.retried_as.is_not(None)),
            sa.func.count().filter(lost, Session.retried_as.is_(None)),
        )
        .where(Session.batch_id == batch_id)
        .group_by(Session.state)
    ).all()
    counts = {state: int(latest) for state, latest, _, _ in rows if latest}
    attempts = {"retried": sum(int(r[2]) for r in rows), "out_of_attempts": sum(int(r[3]) for r in rows)}
    return counts, attempts


def batch_status(services: Services, batch_id: uuid.UUID) -> dict[str, Any]:
    """The batch's counts per state (each sample once), attempts lost to the infrastructure, and an overall status
    (pending, running, finished). Read in one snapshot: the batch row and the counts agree, so a reader never sees
    every sample terminal while ``finished_at`` is still unset (the stamp commits with the last terminal state)."""
    with services.db.snapshot() as db:
        batch = db.get(Batch, batch_id)
        if batch is None:
            raise NotFound(f"batch {batch_id} not found")
        counts, attempts = _counts(db, batch_id)
    status = overall_status(batch.num_sessions, counts, attempts["retried"])
    return {"batch": batch, "status": status, "counts": counts, "attempts": attempts}


def overall_status(num_sessions: int, counts: dict[str, int], retried: int) -> str:
    """``finished`` once every sample is terminal, ``pending`` while all wait untouched, else ``running``."""
    finished = sum(n for state, n in counts.items() if State(state) in TERMINAL)
    if finished == num_sessions:
        return "finished"
    if counts.get(State.PENDING.value, 0) == num_sessions and not retried:
        return "pending"
    return "running"


def mark_batch_finished(db: Any, batch_id: uuid.UUID) -> bool:
    """Stamp ``finished_at`` once no session of the batch is left outside a terminal state; True when this call
    stamped it (the batch finished in this transaction). Called in the transaction that made a session terminal,
    under the feed lock: two sessions ending at once each count the other's state only after it committed, so the
    last of them always stamps (without the lock each could count the other as still open, and neither would)."""
    exclusive(db, FEED)  # the terminal transactions already hold it (feed positions); taken again, it is a no-op
    open_sessions = db.scalar(
        sa.select(sa.func.count())
        .select_from(Session)
        .where(Session.batch_id == batch_id, Session.state.not_in([s.value for s in TERMINAL]))
    )
    if open_sessions:
        return False
    stamped = db.execute(
        sa.update(Batch)
        .where(Batch.id == batch_id, Batch.finished_at.is_(None))
        .values(finished_at=db_clock.now(db))
        .returning(Batch.id)
    ).first()
    return stamped is not None
