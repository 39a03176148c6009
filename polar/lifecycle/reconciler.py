"""The reconciler: finds sessions whose stage task vanished (killed worker, lost broker message) and moves
them on, so every session ends in a terminal state.

- ``running`` with a stale heartbeat: its run worker died. The session goes to ``postrun`` (outcome
  ``worker_lost``) so the calls already captured are still reconstructed and evaluated.
- ``init``/``postrun`` with a stale heartbeat: the stage task is sent again; its claim succeeds on a stale lease.
- ``init``/``ready``/``postrun`` queued for longer than ``requeue_after_s`` with nobody on it: sent again
  (a duplicate is harmless: the second claim finds the session taken).
- ``init``/``ready`` past their deadline: to ``postrun`` as timed out.
- terminal sessions whose runtime teardown was interrupted: torn down.
One reconciler pass runs at a time (an advisory lock), from any worker process.
"""

from __future__ import annotations

import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta

import sqlalchemy as sa

from polar.clock import utcnow
from polar.errors import RuntimeFailure
from polar.lifecycle.admission import admit
from polar.lifecycle.dispatch import Stage
from polar.lifecycle.states import TERMINAL, Outcome, State
from polar.runtimes import RUNTIMES, attach_runtime
from polar.services import Services
from polar.stages.handoff import send_to_postrun
from polar.storage.locks import RECONCILER, try_exclusive
from polar.storage.models import Session
from polar.training.callbacks import deliver_batch_finished, undelivered_batches

_STAGE_OF = {State.INIT: Stage.INIT, State.READY: Stage.READY, State.POSTRUN: Stage.POSTRUN}


@dataclass
class _Plan:
    lost_runs: list[tuple[uuid.UUID, dict | None, str | None]] = field(default_factory=list)
    resend: list[tuple[Stage, uuid.UUID]] = field(default_factory=list)
    expired: list[tuple[uuid.UUID, State]] = field(default_factory=list)
    leaked: list[tuple[uuid.UUID, list[dict]]] = field(default_factory=list)


def _plan(services: Services) -> _Plan | None:
    now = utcnow()
    stale = now - timedelta(seconds=services.config.stale_after_s)
    requeue = now - timedelta(seconds=services.config.requeue_after_s)
    plan = _Plan()
    with services.db.unit() as db:
        if not try_exclusive(db, RECONCILER):
            return None
        rows = db.execute(
            sa.select(Session.id, Session.state, Session.runtime_handle, Session.node).where(
                Session.state == State.RUNNING.value, Session.heartbeat_at < stale
            )
        ).all()
        plan.lost_runs = [(r.id, r.runtime_handle, r.node) for r in rows]
        queued = [s.value for s in _STAGE_OF]
        rows = db.execute(
            sa.select(Session.id, Session.state).where(
                Session.state.in_(queued),
                sa.or_(
                    sa.and_(Session.heartbeat_at < stale, Session.stage_enqueued_at < stale),
                    sa.and_(Session.heartbeat_at.is_(None), Session.stage_enqueued_at < requeue),
                ),
            )
        ).all()
        plan.resend = [(_STAGE_OF[State(r.state)], r.id) for r in rows]
        rows = db.execute(
            sa.select(Session.id, Session.state).where(
                Session.state.in_([State.INIT.value, State.READY.value]),
                Session.deadline_at < now,
                sa.or_(Session.heartbeat_at.is_(None), Session.heartbeat_at < stale),
            )
        ).all()
        plan.expired = [(r.id, State(r.state)) for r in rows]
        rows = db.execute(
            sa.select(Session.id, Session.runtime_handle, Session.evaluator_runtime_handle).where(
                Session.state.in_([s.value for s in TERMINAL]),
                sa.or_(Session.runtime_handle.is_not(None), Session.evaluator_runtime_handle.is_not(None)),
                Session.finished_at < stale,
                Session.node == services.config.node,
            )
        ).all()
        plan.leaked = [(r.id, [h for h in (r.runtime_handle, r.evaluator_runtime_handle) if h]) for r in rows]
    return plan


def _kill_lost(services: Services, handle: dict | None, node: str | None) -> None:
    if not handle or node != services.config.node:
        return  # another node's runtime: its own reconciler pass or postrun tears it down
    try:
        attach_runtime(handle, services.config).kill_processes()
    except RuntimeFailure:
        pass


def _live_sessions(services: Services, ids: list[str]) -> set[str]:
    parsed = []
    for value in ids:
        try:
            parsed.append(uuid.UUID(value))
        except ValueError:
            continue  # not a session of ours: an orphan
    with services.db.unit() as db:
        rows = db.scalars(
            sa.select(Session.id).where(Session.id.in_(parsed), Session.state.not_in([s.value for s in TERMINAL]))
        )
        return {str(row) for row in rows}


def _reap_containers(services: Services) -> int:
    """Remove this deployment's Docker containers on this node whose session has ended or is unknown (e.g. a
    killed worker's)."""
    if "docker" not in RUNTIMES:
        return 0
    from polar.runtimes.docker import reap_orphans

    try:
        return reap_orphans(services.config.node, services.config.deployment, lambda ids: _live_sessions(services, ids))
    except RuntimeFailure:
        return 0  # no Docker engine on this node


def reconcile(services: Services) -> Counter[str]:
    """One pass; returns what it did, by kind."""
    done: Counter[str] = Counter()
    plan = _plan(services)
    if plan is None:
        return done
    stale = utcnow() - timedelta(seconds=services.config.stale_after_s)
    for session_id, handle, node in plan.lost_runs:
        _kill_lost(services, handle, node)
        error = f"run worker lost: no heartbeat for over {services.config.stale_after_s:g}s"
        if send_to_postrun(
            services,
            session_id,
            State.RUNNING,
            Outcome.WORKER_LOST,
            error,
            where=[Session.heartbeat_at < stale],
        ):
            done["lost_runs"] += 1
    for session_id, state in plan.expired:
        if send_to_postrun(services, session_id, state, Outcome.TIMEOUT, f"budget exhausted while {state.value}"):
            done["expired"] += 1
    expired = {session_id for session_id, _ in plan.expired}
    for stage, session_id in plan.resend:
        if session_id not in expired:
            services.dispatch(stage, session_id)
            done[f"resent_{stage.value}"] += 1
    for session_id, handles in plan.leaked:
        for handle in handles:
            try:
                attach_runtime(handle, services.config).destroy()
            except RuntimeFailure:
                pass
        with services.db.unit() as db:
            db.execute(
                sa.update(Session)
                .where(Session.id == session_id)
                .values(runtime_handle=None, evaluator_runtime_handle=None)
            )
        done["torn_down"] += 1
    done["containers_reaped"] += _reap_containers(services)
    for batch_id in undelivered_batches(services, services.config.stale_after_s):
        done["callbacks"] += deliver_batch_finished(services, batch_id)
    done["admitted"] += len(admit(services))
    return done
