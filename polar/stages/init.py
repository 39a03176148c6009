"""Stage ``init``: create the session's runtime and run the task's prepare steps, within the session budget;
then, when the task's evaluator wants a clean runtime to judge in, create and prepare that one too (off the
critical path, before the harness starts).

Init is the one shared stage: whichever node's worker claims the session becomes its ``node`` (where its
runtime lives and every later stage runs), provided that node has room in its own READY bound; a full node
hands the session back to the shared queue for another.

The budget starts here (not while pending): ``deadline_at = init start + timeout_seconds``.

A prepare step of the task's own that fails is the task's outcome (``prepare_failed``); a runtime that cannot be
created or used is the infrastructure's (``runtime_failed``, retried as a new attempt).
"""

from __future__ import annotations

import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from polar.clock import utcnow
from polar.errors import RuntimeFailure
from polar.evaluators import fresh_runtime_spec, load_evaluator
from polar.lifecycle.dispatch import Stage
from polar.lifecycle.states import Outcome, State
from polar.lifecycle.transitions import transition
from polar.runtimes import EVALUATOR_ROLE, Runtime, create_runtime
from polar.runtimes.base import command_env
from polar.services import Services
from polar.stages.handoff import send_to_postrun
from polar.stages.lease import Claimed, NodeFull, claim, heartbeat
from polar.storage.models import Session
from polar.task_request import CopyStep, RunStep, RuntimeSpec

# How long a full node's init worker waits before handing a session back (it has nothing else to do meanwhile).
HAND_BACK_S = 0.5


class _BudgetExhausted(Exception):
    """The session's time ran out during init."""


class _StepFailed(Exception):
    """One of the task's own prepare steps failed: the task's outcome, not the infrastructure's."""


def _start_budget(services: Services, claimed: Claimed) -> Claimed:
    if claimed.session.deadline_at is not None:
        return claimed
    now = utcnow()
    deadline = now + timedelta(seconds=claimed.task.timeout_seconds)
    with services.db.unit() as db:
        db.execute(
            sa.update(Session).where(Session.id == claimed.session.id).values(init_started_at=now, deadline_at=deadline)
        )
    claimed.session.init_started_at, claimed.session.deadline_at = now, deadline
    return claimed


def _prepare(runtime: Runtime, spec: RuntimeSpec, claimed: Claimed, what: str = "prepare step") -> None:
    env = command_env(runtime.session_dir, spec.env)
    for index, step in enumerate(spec.prepare):
        remaining = claimed.remaining_s
        if remaining <= 0:
            raise _BudgetExhausted(f"budget exhausted before {what} {index}")
        if isinstance(step, CopyStep):
            if not Path(step.copy_).exists():
                raise _StepFailed(f"{what} {index}: nothing to copy at {step.copy_!r}")
            runtime.copy_in(Path(step.copy_), step.to)
            continue
        assert isinstance(step, RunStep)
        limit = min(remaining, step.timeout_seconds or remaining)
        result = runtime.exec(["/bin/sh", "-c", step.run], env, limit, log_name="prepare")
        if result.timed_out and limit >= remaining:
            raise _BudgetExhausted(f"{what} {index} ran past the session budget")
        if result.timed_out or result.exit_code != 0:
            status = "timed out" if result.timed_out else f"exited with code {result.exit_code}"
            raise _StepFailed(f"{what} {index} ({step.run!r}) {status}: {result.output_tail[-500:]}")


def _record(services: Services, session_id: uuid.UUID, **handles: dict[str, Any]) -> None:
    with services.db.unit() as db:
        db.execute(sa.update(Session).where(Session.id == session_id).values(**handles))


def _prepare_evaluator_runtime(services: Services, claimed: Claimed) -> None:
    """The clean runtime the evaluator judges in, when it wants one (e.g. ``swebench``)."""
    try:
        spec = fresh_runtime_spec(load_evaluator(claimed.task.evaluator), claimed.task)
    except Exception as exc:  # the evaluator's own code: whatever it raises fails the session, nothing else
        raise _StepFailed(f"evaluator {claimed.task.evaluator.name!r}: {type(exc).__name__}: {exc}") from exc
    if spec is None:
        return
    runtime = create_runtime(claimed.session.id, spec, services.config, EVALUATOR_ROLE)
    _record(services, claimed.session.id, evaluator_runtime_handle=runtime.handle)
    _prepare(runtime, spec, claimed, what="evaluator runtime prepare step")


def init_session(services: Services, session_id: uuid.UUID) -> None:
    """Prepare the session's runtime and hand the session to ``ready`` (or to ``postrun`` if preparing failed)."""
    try:
        claimed = claim(services, session_id, State.INIT, take_node=True)
    except NodeFull:
        time.sleep(HAND_BACK_S)
        services.dispatch(Stage.INIT, session_id)
        return
    if claimed is None:
        return
    claimed = _start_budget(services, claimed)
    with heartbeat(services, session_id, State.INIT):
        try:
            runtime = create_runtime(session_id, claimed.task.runtime, services.config)
            _record(services, session_id, runtime_handle=runtime.handle)
            _prepare(runtime, claimed.task.runtime, claimed)
            _prepare_evaluator_runtime(services, claimed)
        except _BudgetExhausted as exc:
            send_to_postrun(services, session_id, State.INIT, Outcome.TIMEOUT, str(exc))
            return
        except _StepFailed as exc:
            send_to_postrun(services, session_id, State.INIT, Outcome.PREPARE_FAILED, str(exc))
            return
        except RuntimeFailure as exc:
            send_to_postrun(services, session_id, State.INIT, Outcome.RUNTIME_FAILED, str(exc))
            return
    with services.db.unit() as db:
        moved = transition(db, session_id, State.INIT, State.READY, by=services)
    if moved:
        services.dispatch(Stage.READY, session_id)
