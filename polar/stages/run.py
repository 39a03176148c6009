"""Stage ``run``: mint the proxy key, wait for an engine that answers, start the harness in the runtime with its
whole budget, and enforce it (``polar.lifecycle.budget``).

Starting the run takes a lease (``polar.stages.lease``); the hand-off to postrun checks it, and a run whose lease
went elsewhere (the reconciler judged it lost) kills its harness and changes nothing.
"""

from __future__ import annotations

import threading
import uuid

import sqlalchemy as sa

from polar.codec.json_body import storable_text
from polar.contract.states import Outcome, State
from polar.errors import RuntimeFailure, UnsafePath
from polar.harnesses.base import HarnessContext
from polar.harnesses.registry import HARNESSES
from polar.lifecycle.admission import admit
from polar.lifecycle.budget import RunBudget, budget_left, start_run_budget
from polar.lifecycle.transitions import transition
from polar.proxy.keys import hash_key, mint_key
from polar.proxy.refusals import declare_key
from polar.runtimes import Runtime, attach_runtime
from polar.runtimes.bounds import SandboxBounds
from polar.services import Services
from polar.stages.engine_gate import wait_for_engine
from polar.stages.handoff import send_to_postrun
from polar.stages.lease import Claimed, cancelled_now, heartbeat, load
from polar.storage import db_clock
from polar.storage.models import Session
from polar.storage.outage import ride_out


def _start(services: Services, session_id: uuid.UUID, key: str) -> uuid.UUID | None:
    """Ready → running with a new lease; the lease, or None when another took the session first."""
    lease = uuid.uuid4()
    with services.db.unit() as db:
        started = transition(
            db,
            session_id,
            State.READY,
            State.RUNNING,
            by=services,
            proxy_key_hash=hash_key(key),
            heartbeat_at=db_clock.now(db),
            lease=lease,
        )
    return lease if started else None


def _record_handle(services: Services, claimed: Claimed, runtime: Runtime) -> None:
    def record() -> None:
        with services.db.unit() as db:
            db.execute(
                sa.update(Session)
                .where(Session.id == claimed.session.id, claimed.held)
                .values(runtime_handle=runtime.handle)
            )

    # The harness has started: a database restart right now must not turn a healthy run into a lost one.
    ride_out(record, within_s=services.config.db_outage_s)


def _execute(
    services: Services, claimed: Claimed, key: str, runtime: Runtime, budget: RunBudget
) -> tuple[Outcome, int | None, str | None]:
    session, task = claimed.session, claimed.task
    # A sandbox reaches the proxy through its relay alone, at the address the harness sees inside.
    bounds = SandboxBounds.of_task(services.config, task.runtime.limits)
    access_to = runtime.proxy_access(services.config.proxy_url, task.runtime.egress_allow, bounds, hash_key(key))
    with access_to as access:
        context = HarnessContext(
            session_id=session.id,
            task_id=session.task_id,
            instruction=task.instruction,
            spec=task.harness,
            proxy_url=access.url,
            proxy_key=key,
            session_dir=runtime.session_dir,
            runtime_env=dict(task.runtime.env),
            attempt=session.attempt,
            plugin_modules=services.config.plugin_modules,
        )
        launch = HARNESSES[task.harness.name].launch(context)
        result = runtime.exec(
            access.wrap(launch.command),
            {**launch.env, **access.env},
            budget.left,
            log_name="harness",
            on_start=lambda _pid: _record_handle(services, claimed, runtime),
        )
    # The session directory goes at teardown, so a harness's last output is kept with the error: what it was doing
    # when the budget ran out, or what it said when it failed.
    tail = storable_text(result.output_tail[-2000:])  # the harness's own bytes: a NUL in them must not crash the store
    if result.timed_out:
        error = f"harness exceeded the session budget of {task.timeout_seconds:g}s"
        return Outcome.TIMEOUT, None, f"{error}; its last output: {tail}" if tail.strip() else error
    error = None if result.exit_code == 0 else f"harness exited with code {result.exit_code}: {tail}"
    return Outcome.EXITED, result.exit_code, error


def _run(services: Services, claimed: Claimed, key: str) -> tuple[Outcome, int | None, str | None]:
    """The harness under the session's heartbeat; a batch cancel kills it and the outcome says so.

    Its budget starts only once an engine answers (the wait for one, like the wait in ``ready``, is not charged)
    and is re-read at each heartbeat, so a weight-sync pause does not count against it (``polar.lifecycle.budget``).
    """
    session_id, timeout_s = claimed.session.id, claimed.task.timeout_seconds
    cancelled, stopped = threading.Event(), threading.Event()
    budget = RunBudget(timeout_s)
    budget_started = threading.Event()
    try:
        runtime = attach_runtime(claimed.session.runtime_handle or {}, services.config)

        def cancel() -> None:
            cancelled.set()
            stopped.set()
            runtime.kill_processes()

        def lost() -> None:  # the lease gone elsewhere (judged lost while we ran): stop; our hand-off changes nothing
            stopped.set()
            runtime.kill_processes()

        def beat() -> None:
            if budget_started.is_set():
                budget.update(*budget_left(services, session_id))

        with heartbeat(services, session_id, claimed.lease, on_cancel=cancel, on_lost=lost, on_beat=beat):
            unanswered = wait_for_engine(services, services.config.engine_wait_s, stopped)
            if unanswered is not None and not stopped.is_set():
                return Outcome.ENGINE_FAILED, None, unanswered
            if not stopped.is_set() and cancelled_now(services, session_id):  # before a beat could tell
                cancel()
            if not stopped.is_set():
                ride_out(
                    lambda: start_run_budget(services, session_id, claimed.held, timeout_s),
                    within_s=services.config.db_outage_s,
                )
                budget.update(timeout_s, False)
                budget_started.set()
                outcome, exit_code, error = _execute(services, claimed, key, runtime, budget)
            else:
                outcome, exit_code, error = Outcome.EXITED, None, "the harness was not started"
    except RuntimeFailure as exc:
        return Outcome.RUNTIME_FAILED, None, str(exc)
    except UnsafePath as exc:  # a prepare step linked the harness's config or log somewhere: it never started
        return Outcome.PREPARE_FAILED, None, f"the harness was not started: {exc}"
    if cancelled.is_set():
        return Outcome.CANCELLED, exit_code, "the batch was cancelled, or the group stopped early, as the harness ran"
    return outcome, exit_code, error


def run_session(services: Services, session_id: uuid.UUID) -> None:
    """Run the harness to its end (or its budget's) and hand the session to postrun."""
    key = mint_key()
    lease = _start(services, session_id, key)
    if lease is None:
        return
    # Before the harness has it: a refusal the proxy makes before it can place the key is kept for this session.
    declare_key(services.config.redis_url, hash_key(key))
    admit(services)  # leaving ready frees a READY-buffer slot
    claimed = load(services, session_id, lease)
    assert claimed is not None
    outcome, exit_code, error = _run(services, claimed, key)
    # The harness's work is done: a database restart right now must not turn it into a lost run.
    ride_out(
        lambda: send_to_postrun(
            services,
            session_id,
            State.RUNNING,
            outcome,
            error,
            where=[claimed.held],
            exit_code=exit_code,
            run_finished_at=db_clock.now(services.db),
        ),
        within_s=services.config.db_outage_s,
    )
