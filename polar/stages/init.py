"""Stage ``init``: create the session's runtime and run the task's prepare steps, within the session budget;
then, when the task's evaluator wants a clean runtime to judge in, create and prepare that one too (off the
critical path, before the harness starts).

Init is the one shared stage: whichever node's worker claims the session becomes its ``node`` (where its
runtime lives and every later stage runs), provided that node has room in its own READY bound; a full node
hands the session back to the shared queue for another.

Init's prepare steps are bounded by the session budget from init's start (``deadline_at = init start +
timeout_seconds``); the harness gets its whole budget again when it starts (``polar.lifecycle.budget``).

Preparation is not the policy: the harness has not started, so however init fails the attempt is the
infrastructure's, retried as a new attempt up to ``max_attempts`` and never served. A prepare step that fails (of
the session's runtime or the evaluator's) ends it ``prepare_failed``; init's budget running out ``init_timeout``;
a runtime that cannot be created or used ``runtime_failed``; an evaluator whose own code fails while it says which
runtime it wants ``unscorable`` (it could not be loaded, or raised). A run step known to be flaky (a network
fetch) may ask to be run again when it fails, ``retry_on_failure`` times, within the same budget.
"""

from __future__ import annotations

import functools
import time
import uuid
from collections.abc import Sequence

import sqlalchemy as sa

from polar.contract.dispatch import Stage
from polar.contract.states import Outcome, State
from polar.contract.task_request import CopyStep, RunStep, RuntimeSpec
from polar.errors import RuntimeFailure, UnsafePath, ValidationError
from polar.evaluators import fresh_runtime_spec, load_evaluator
from polar.lifecycle.outbox import dispatch, send_due
from polar.lifecycle.transitions import transition
from polar.runtimes import EVALUATOR_ROLE, SESSION_ROLE, Runtime, create_runtime
from polar.runtimes.base import command_env
from polar.runtimes.copy_steps import copy_source
from polar.runtimes.task_images import copy_task_images
from polar.services import Services
from polar.stages.handoff import send_to_postrun
from polar.stages.lease import Claimed, NodeFull, claim, heartbeat, load
from polar.storage import db_clock
from polar.storage.models import Session

# How long a full node's init worker waits before handing a session back (it has nothing else to do meanwhile).
HAND_BACK_S = 0.5


# The pause before a failed run step's next try (seconds, times the tries so far), within the budget.
RETRY_PAUSE_S = 1.0


class _BudgetExhausted(Exception):
    """The session's time ran out during init."""


class _StepFailed(Exception):
    """A prepare step failed (its last try, when it may be retried)."""


class _EvaluatorFailed(Exception):
    """The evaluator's own code failed (not loadable, or raised deciding its runtime): nothing could judge."""


class _LeaseLost(Exception):
    """Another claim (or a cancel) took the session while this init ran."""


def _start_budget(services: Services, claimed: Claimed) -> Claimed:
    """The budget starts at the first init (a re-run keeps it), on the database's clock."""
    with services.db.unit() as db:
        db.execute(
            sa.update(Session)
            .where(Session.id == claimed.session.id, claimed.held, Session.deadline_at.is_(None))
            .values(init_started_at=db_clock.now(db), deadline_at=db_clock.shifted(db, claimed.task.timeout_seconds))
        )
    reloaded = load(services, claimed.session.id, claimed.lease)
    return reloaded or claimed


def _copy(runtime: Runtime, step: CopyStep, roots: Sequence[str]) -> None:
    """One copy step, its bounds checked again here (``polar.runtimes.copy_steps``): the source under the copy
    roots on its real path now, the destination reached without following a link an earlier step planted."""
    source = copy_source(step.copy_, roots)
    if not source.exists():
        raise _StepFailed(f"nothing to copy at {step.copy_!r}")
    runtime.copy_in(source, step.to)


def _copy_images(runtime: Runtime, claimed: Claimed, services: Services) -> None:
    """The task's images into the work directory (``polar.runtimes.task_images``), before its prepare steps."""
    config = services.config
    try:
        copy_task_images(runtime, claimed.task, config.copy_roots, config.max_image_bytes)
    except (ValidationError, UnsafePath) as exc:
        raise _StepFailed(f"task images: {exc}") from exc


def _prepare(
    runtime: Runtime, spec: RuntimeSpec, claimed: Claimed, roots: Sequence[str], what: str = "prepare step"
) -> None:
    env = command_env(runtime.session_dir, spec.env)
    for index, step in enumerate(spec.prepare):
        remaining = claimed.remaining_s
        if remaining <= 0:
            raise _BudgetExhausted(f"budget exhausted before {what} {index}")
        if isinstance(step, CopyStep):
            try:
                _copy(runtime, step, roots)
            except (_StepFailed, ValidationError, UnsafePath) as exc:
                raise _StepFailed(f"{what} {index}: {exc}") from exc
            continue
        assert isinstance(step, RunStep)
        _run_step(runtime, step, env, claimed, f"{what} {index}")


def _run_step(runtime: Runtime, step: RunStep, env: dict[str, str], claimed: Claimed, name: str) -> None:
    """One run step, tried again after a failure (a non-zero exit, or its own timeout) up to its
    ``retry_on_failure`` times while the budget lasts."""
    tries = step.retry_on_failure + 1
    for tried in range(tries):
        if tried:
            if claimed.remaining_s <= RETRY_PAUSE_S * tried:
                raise _BudgetExhausted(f"budget exhausted before {name} could be tried again (tried {tried} times)")
            time.sleep(RETRY_PAUSE_S * tried)
        remaining = claimed.remaining_s
        limit = min(remaining, step.timeout_seconds or remaining)
        try:
            result = runtime.exec(["/bin/sh", "-c", step.run], env, limit, log_name="prepare")
        except UnsafePath as exc:  # an earlier step linked the log somewhere
            raise _StepFailed(f"{name}: {exc}") from exc
        if result.timed_out and limit >= remaining:
            raise _BudgetExhausted(f"{name} ran past the session budget")
        if not result.timed_out and result.exit_code == 0:
            return
        if tried == tries - 1:
            status = "timed out" if result.timed_out else f"exited with code {result.exit_code}"
            times = f" (tried {tries} times)" if tries > 1 else ""
            raise _StepFailed(f"{name} ({step.run!r}) {status}{times}: {result.output_tail[-500:]}")


def _record(services: Services, claimed: Claimed, runtime: Runtime, column: str) -> None:
    """Note a runtime's handle on the session while our lease holds; otherwise it is ours alone: remove it."""
    with services.db.unit() as db:
        recorded = db.execute(
            sa.update(Session)
            .where(Session.id == claimed.session.id, claimed.held)
            .values({column: runtime.handle})
            .returning(Session.id)
        ).first()
    if recorded is None:
        runtime.destroy()
        raise _LeaseLost()


def _create(services: Services, claimed: Claimed, spec: RuntimeSpec, role: str, column: str) -> Runtime:
    # Named after this claim: a re-run of init (after our lease went stale) never removes what we are using.
    instance = claimed.lease.hex[:8] if claimed.lease else None
    runtime = create_runtime(claimed.session.id, spec, services.config, role, instance)
    _record(services, claimed, runtime, column)
    return runtime


def _prepare_evaluator_runtime(services: Services, claimed: Claimed) -> Runtime | None:
    """The clean runtime the evaluator judges in, when it wants one (e.g. ``swebench``)."""
    try:
        spec = fresh_runtime_spec(load_evaluator(claimed.task.evaluator, services.config.plugin_modules), claimed.task)
    except Exception as exc:  # the evaluator's own code: whatever it raises, not the task's doing
        raise _EvaluatorFailed(f"evaluator {claimed.task.evaluator.name!r}: {type(exc).__name__}: {exc}") from exc
    if spec is None:
        return None
    runtime = _create(services, claimed, spec, EVALUATOR_ROLE, "evaluator_runtime_handle")
    _prepare(runtime, spec, claimed, services.config.copy_roots, what="evaluator runtime prepare step")
    return runtime


def _hand_back(services: Services, session_id: uuid.UUID) -> None:
    time.sleep(HAND_BACK_S)
    dispatch(services, Stage.INIT, session_id)


def init_session(services: Services, session_id: uuid.UUID) -> None:
    """Prepare the session's runtime and hand the session to ``ready`` (or to ``postrun`` if preparing failed)."""
    try:
        claimed = claim(services, session_id, State.INIT, take_node=True)
    except NodeFull:
        _hand_back(services, session_id)
        return
    if claimed is None:
        return
    claimed = _start_budget(services, claimed)
    made: list[Runtime] = []
    fail = functools.partial(send_to_postrun, services, session_id, State.INIT, where=[claimed.held])
    with heartbeat(services, session_id, claimed.lease):
        try:
            made.append(_create(services, claimed, claimed.task.runtime, SESSION_ROLE, "runtime_handle"))
            _copy_images(made[0], claimed, services)
            _prepare(made[0], claimed.task.runtime, claimed, services.config.copy_roots)
            made += [r for r in [_prepare_evaluator_runtime(services, claimed)] if r is not None]
        except _LeaseLost:
            moved = False
        except _BudgetExhausted as exc:
            moved = fail(Outcome.INIT_TIMEOUT, str(exc))
        except _StepFailed as exc:
            moved = fail(Outcome.PREPARE_FAILED, str(exc))
        except _EvaluatorFailed as exc:
            moved = fail(Outcome.UNSCORABLE, str(exc))
        except RuntimeFailure as exc:
            moved = fail(Outcome.RUNTIME_FAILED, str(exc))
        else:
            with services.db.unit() as db:
                moved = transition(db, session_id, State.INIT, State.READY, by=services, where=[claimed.held],
                                   due=Stage.READY)  # fmt: skip
            if moved:
                send_due(services, [session_id])
    if not moved:  # our lease went to another claim (or a cancel): what we made is nobody's
        for runtime in made:
            runtime.destroy()
