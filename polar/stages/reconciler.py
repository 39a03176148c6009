"""The reconciler: finds sessions whose stage task vanished (killed worker, lost broker message, lost node) and
moves them on, so every session ends in a terminal state.

- every pass first announces this node as alive (``polar.lifecycle.nodes``); a worker process whose node was
  stamped by a sibling within the interval skips the pass, so a node runs one pass per interval, not one per
  process;
- a *lost node* (no worker seen for ``stale_after_s``): its sessions in init, ready or running go to postrun as
  ``node_lost``, and those already in postrun are re-labelled so; all are finished from the shared postrun queue
  by a surviving node, and their next attempts run elsewhere;
- ``running`` with a stale heartbeat on a live node: its run worker died. The session goes to ``postrun``
  (outcome ``worker_lost``) so the calls already captured are still reconstructed; the sample is retried;
- a stage message due but never sent (the broker failed after the commit that made it due): sent
  (``polar.lifecycle.outbox``);
- ``init``/``ready``/``postrun`` whose stage message was lost (``polar.lifecycle.lost_messages`` says how that
  is told from waiting one's turn): sent again (a duplicate is harmless: the second claim finds it taken);
- ``init`` past its deadline with its worker gone: to ``postrun`` as ``init_timeout`` (the infrastructure's: the
  harness never started, so the sample is retried); ``ready`` never expires, since waiting for a run slot is not
  charged (``polar.lifecycle.budget``);
- a weight-sync pause held longer than ``POLAR_MAX_PAUSE`` (a trainer that died paused): resumed, audited and
  logged (``polar.training.pause_limit``);
- this node's runtimes whose session has ended (teardown interrupted, or finished elsewhere while this node was
  lost): torn down; session directories and containers of sessions that ended or are unknown: removed.

Lease judgments (lost runs, lost nodes) need evidence that the judge itself was watching: a heartbeat that could
not be written because the database was down or paused (or this process was stopped) says nothing about its
worker. ``LeaseJudge`` allows them only after a whole stale window of prompt passes, and a pass that was slow
drops the judgments it computed (the database may have resumed from a pause mid-pass).

One reconciler pass runs at a time (an advisory lock), from any worker process.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from polar.contract.dispatch import Stage
from polar.contract.states import TERMINAL, Outcome, State
from polar.errors import RuntimeFailure
from polar.lifecycle.admission import admit
from polar.lifecycle.lost_messages import lost_messages
from polar.lifecycle.nodes import announce, lost_nodes
from polar.lifecycle.outbox import dispatch, due, send_due, unsent
from polar.runtimes import RUNTIMES, attach_runtime, session_disk
from polar.services import Services
from polar.stages.handoff import send_to_postrun
from polar.storage import db_clock
from polar.storage.locks import RECONCILER, try_exclusive
from polar.storage.models import Session
from polar.training.pause_limit import end_overlong_pause

_HELD = [State.INIT.value, State.READY.value, State.RUNNING.value]


class LeaseJudge:
    """Whether the reconciler may judge leases: only once it has seen the database answer promptly, pass after
    pass, for ``stale_after_s``. A pass is prompt when it took less than half the stale window and came less than
    half a stale window after the previous one (so a stopped process or a paused database shows as a gap)."""

    def __init__(self, stale_after_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._stale_after_s = stale_after_s
        self._clock = clock
        self._watching_since: float | None = None
        self._last_pass: float | None = None

    @property
    def prompt_s(self) -> float:
        return self._stale_after_s / 2

    def observe(self, prompt: bool) -> None:
        """Record a pass that ended now: prompt (it took less than ``prompt_s``) or not (slow, or it failed)."""
        now = self._clock()
        gap_ok = self._last_pass is None or now - self._last_pass <= self.prompt_s + self._stale_after_s / 4
        self._last_pass = now
        if prompt and gap_ok:
            self._watching_since = self._watching_since if self._watching_since is not None else now
        else:
            self._watching_since = None

    @property
    def may_judge(self) -> bool:
        return self._watching_since is not None and self._clock() - self._watching_since >= self._stale_after_s


@dataclass
class _Plan:
    lost_nodes: list[str] = field(default_factory=list)
    node_lost: list[tuple[uuid.UUID, State, str]] = field(default_factory=list)
    lost_runs: list[tuple[uuid.UUID, dict | None, str | None]] = field(default_factory=list)
    resend: list[tuple[Stage, Any]] = field(default_factory=list)
    expired: list[tuple[uuid.UUID, State]] = field(default_factory=list)
    leaked: list[tuple[uuid.UUID, list[dict]]] = field(default_factory=list)
    unsent: list[uuid.UUID] = field(default_factory=list)


def _on_live_node(lost: list[str]) -> sa.ColumnElement[bool]:
    return sa.or_(Session.node.is_(None), Session.node.not_in(lost)) if lost else sa.true()


def _plan(services: Services, judge_leases: bool) -> _Plan | None:
    plan = _Plan()
    with services.db.unit() as db:
        if not try_exclusive(db, RECONCILER):
            return None
        # Every judgment on the database's clock: machines' clocks never matter.
        now = db_clock.now(db)
        stale = db_clock.ago(db, services.config.stale_after_s)
        requeue = db_clock.ago(db, services.config.requeue_after_s)
        lost = lost_nodes(db, services.config.stale_after_s) if judge_leases else []
        plan.lost_nodes = lost
        live = _on_live_node(lost)
        if lost:
            lease_gone = sa.or_(Session.heartbeat_at.is_(None), Session.heartbeat_at < stale)
            rows = db.execute(
                sa.select(Session.id, Session.state, Session.node).where(
                    Session.node.in_(lost),
                    sa.or_(
                        Session.state.in_(_HELD),
                        # Already in postrun: due on the lost node's queue, or re-sent unpinned a stale window ago
                        # and not taken (one due and unsent goes out with the outbox).
                        sa.and_(
                            Session.state == State.POSTRUN.value,
                            lease_gone,
                            sa.or_(Session.due_node.is_not(None), Session.stage_enqueued_at < stale),
                        ),
                    ),
                )
            ).all()
            plan.node_lost = [(r.id, State(r.state), r.node) for r in rows]
        if judge_leases:
            rows = db.execute(
                sa.select(Session.id, Session.runtime_handle, Session.node).where(
                    Session.state == State.RUNNING.value, Session.heartbeat_at < stale, live
                )
            ).all()
            plan.lost_runs = [(r.id, r.runtime_handle, r.node) for r in rows]
        plan.resend = lost_messages(db, live, stale, requeue, services.config.run_concurrency)
        rows = db.execute(
            sa.select(Session.id, Session.state).where(
                Session.state == State.INIT.value,  # ready waits uncharged: the budget starts with the harness
                Session.deadline_at < now,
                sa.or_(Session.heartbeat_at.is_(None), Session.heartbeat_at < stale),
                live,
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
        # Due but never sent (the broker failed after the commit, or the sender died): send now.
        plan.unsent = unsent(db, services.config.heartbeat_interval_s * 2)
    return plan


def _end_on_lost_node(services: Services, session_id: uuid.UUID, state: State, node: str) -> bool:
    """Hand a lost node's session to the shared postrun queue as ``node_lost`` (it cannot be reached there)."""
    error = f"node {node!r} lost: none of its workers seen for over {services.config.stale_after_s:g}s"
    on_node = Session.node == node
    if state is not State.POSTRUN:
        return send_to_postrun(services, session_id, state, Outcome.NODE_LOST, error, where=[on_node], pinned=False)
    with services.db.unit() as db:
        relabelled = db.execute(
            sa.update(Session)
            .where(Session.id == session_id, Session.state == State.POSTRUN.value, on_node)
            .values(
                outcome=Outcome.NODE_LOST.value, error=error, heartbeat_at=None, lease=None,
                **due(db, Stage.POSTRUN, pinned=False),
            )
            .returning(Session.id)
        ).first()  # fmt: skip
    if relabelled is not None:
        send_due(services, [session_id])
    return relabelled is not None


def _kill_lost(services: Services, handle: dict | None) -> None:
    if not handle:
        return
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


def _session_of(directory: Path) -> str | None:
    """The session a runtime directory belongs to (``<id>`` or ``<id>-<role>``), or None for anything else."""
    try:
        return str(uuid.UUID(directory.name[:36]))
    except ValueError:
        return None


def _reap_directories(services: Services) -> int:
    """Remove session directories under this node's work root whose session has ended or is unknown and that
    nothing touched for a stale window (a lost node's, once it is back). A directory of a session still live
    anywhere is kept: the work root may be shared by the nodes of one machine."""
    root = Path(services.config.work_root)
    if not root.is_dir():
        return 0
    quiet_since = time.time() - services.config.stale_after_s
    candidates = {}
    for entry in root.iterdir():
        session = _session_of(entry)
        try:
            if session and entry.is_dir() and entry.stat().st_mtime < quiet_since:
                candidates[entry] = session
        except OSError:
            continue
    if not candidates:
        return 0
    live = _live_sessions(services, sorted(set(candidates.values())))
    removed = 0
    for entry, session in candidates.items():
        if session not in live:
            session_disk.remove(entry)  # a sandbox's directory is a mounted filesystem: unmounted first
            removed += not entry.exists()
    return removed


def reconcile(services: Services, judge: LeaseJudge | None = None, every_s: float | None = None) -> Counter[str]:
    """One pass; returns what it did, by kind. Without a ``judge`` (tests, one-off calls) leases are judged. With
    ``every_s`` (a worker's loop), the pass runs only if no process of this node ran one in the last ``every_s``
    seconds: its other processes just find the node stamped. Every node still runs its own pass, since part of
    the work (its runtimes, directories and containers) is local to it."""
    done: Counter[str] = Counter()
    started = time.monotonic()
    try:
        claimed = announce(services, unless_within_s=every_s)
        plan = _plan(services, judge_leases=judge is None or judge.may_judge) if claimed else None
    except Exception:
        if judge is not None:
            judge.observe(prompt=False)
        raise
    prompt = time.monotonic() - started < (judge.prompt_s if judge else float("inf"))
    if judge is not None:
        judge.observe(prompt)
    if plan is None:
        return done
    if not prompt:  # the database may have resumed from a pause mid-pass: its heartbeats are no evidence
        plan.node_lost, plan.lost_runs = [], []
        done["judgments_dropped"] += 1
    done["unsent_sent"] += send_due(services, plan.unsent)
    done["pauses_expired"] += end_overlong_pause(services) is not None
    for session_id, state, node in plan.node_lost:
        done["node_lost"] += _end_on_lost_node(services, session_id, state, node)
    for session_id, handle, node in plan.lost_runs:
        error = f"run worker lost: no heartbeat for over {services.config.stale_after_s:g}s"
        # Compare-and-set first: a run whose heartbeat came back meanwhile keeps running, unharmed.
        where = [Session.heartbeat_at < db_clock.ago(services.db, services.config.stale_after_s)]
        if send_to_postrun(services, session_id, State.RUNNING, Outcome.WORKER_LOST, error, where=where):
            if node == services.config.node:  # another node's postrun kills what is left there
                _kill_lost(services, handle)
            done["lost_runs"] += 1
    for session_id, state in plan.expired:
        # Out of time while preparing: the harness never started, so nothing of the policy's was measured.
        error = f"budget exhausted while {state.value}, before the harness started"
        if send_to_postrun(services, session_id, state, Outcome.INIT_TIMEOUT, error):
            done["expired"] += 1
    expired = {session_id for session_id, _ in plan.expired}
    for stage, session_id in plan.resend:
        if session_id not in expired:
            dispatch(services, stage, session_id)
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
    done["directories_reaped"] += _reap_directories(services)
    done["admitted"] += len(admit(services))
    return done
