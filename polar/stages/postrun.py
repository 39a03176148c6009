"""Stage ``postrun``: always entered. Rebuild trajectories from the captured calls, mark the session's main chain
(``polar.stages.segments``: its answer is the one judged), evaluate, store the reward, end the session in its
terminal state, then tear the runtimes down (the session's, and the evaluator's clean one when it had one).

The terminal compare-and-set, the trajectory rows and the reward commit in one transaction, so a redelivered
postrun can never leave duplicate trajectories.

Only an attempt with a task outcome is scored (``polar.lifecycle.attempts``); a cancelled one never is, and one
whose harness got no model answer is scored for the record but stored ``excluded`` (never served). How the
evaluator ends decides the rest: a score; a work that broke, hung or tampered with its judging (``EvaluationError``,
``UnsafePath``) scores the task's ``failure_reward``, never None; the evaluator's own code failing (any other
exception, or a reward that is no finite number) makes the attempt ``unscorable``, an infrastructure outcome, and
an evaluator runtime that broke makes it ``runtime_failed``. An attempt lost to the infrastructure is not scored:
its trajectories are kept for audit, and the same transaction starts the sample's next attempt, or settles the
sample as out of attempts.
Postrun is bounded: after ``MAX_POSTRUN_CLAIMS`` tries that never finished, the next ends the session unscored
(trajectories kept) instead of retrying forever; what an evaluator reads of a session's output is bounded too
(``polar.runtimes.session_files.read_output``, which also never reads through a link the harness left).
A lost node's sessions are finished here by a surviving node, which cannot reach their runtimes: it leaves them
(and their handles) for the lost node's reconciler to tear down when it comes back.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from polar.codec.json_body import storable, storable_text
from polar.contract.states import Outcome, State
from polar.errors import EvaluationError, RuntimeFailure, UnsafePath
from polar.evaluators import Evaluation, EvaluationContext, load_evaluator
from polar.lifecycle.admission import admit
from polar.lifecycle.attempts import (
    CallEvidence,
    Disruption,
    OutcomeClass,
    class_of,
    classify,
    refine,
    retries_left,
    start_next_attempt,
)
from polar.lifecycle.batches import mark_batch_finished
from polar.lifecycle.transitions import transition
from polar.proxy.refusals import INFRASTRUCTURE_REASONS, fold_in
from polar.reconstruction import RECONSTRUCTIONS, CapturedCall, TrajectoryData
from polar.reconstruction.main_chain import answer_call
from polar.runtimes import Runtime, attach_runtime
from polar.services import Services
from polar.stages.circuit_breaker import count_attempt
from polar.stages.early_stop import stop_if_enough
from polar.stages.lease import Claimed, claim, heartbeat
from polar.stages.segments import annotate
from polar.storage.calls.read import answered_calls, engine_failures, last_answer_at, rebuild, session_rows
from polar.storage.models import Batch, CallRefusal, Session, Task, Trajectory
from polar.storage.prompts import prompt_views
from polar.storage.storable import storing
from polar.training.callbacks import record_session_events
from polar.training.feed import assign_position


def captured_calls(services: Services, session_id: uuid.UUID) -> list[CapturedCall]:
    """The session's successful calls whose answers reached the harness, in ``seq`` order, with full prompts
    (stored as deltas, see ``polar.storage.prompts``) read through their deltas (``PromptView``): a long session's
    prompts cost its stored ids once, not the sum of every prompt's length."""
    with services.db.unit() as db:
        rows = answered_calls(db, session_id)
    prompts = prompt_views(rows)
    return [
        CapturedCall(
            str(r.id),
            r.seq,
            r.agent,
            prompts[r.id],
            r.completion_token_ids,
            r.logprobs,
            r.finish_reason,
            r.media or (),
            (r.policy_version, r.policy_version_end),
        )
        for r in rows
    ]


def final_message(services: Services, session_id: uuid.UUID, call: CapturedCall | None) -> str | None:
    """The text of the model's answer in ``call`` (the main chain's last answered call,
    ``polar.reconstruction.main_chain.answer_call``): its assistant message (captured calls keep the engine's
    chat-shaped response); None without a call."""
    if call is None:
        return None
    call_id = uuid.UUID(call.call_id)
    with services.db.unit() as db:
        rows = session_rows(db, session_id, up_to_seq=call.seq, parts=["response"])
    response = rebuild(rows, {call_id}, prompts=False, parts=["response"])[call_id].response
    choices = (response or {}).get("choices") or []
    message = choices[0].get("message") if choices and isinstance(choices[0], dict) else None
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, list):  # content parts
        content = "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return content if isinstance(content, str) else None


def final_state(outcome: Outcome, exit_code: int | None, evaluator_error: str | None) -> State:
    if outcome is Outcome.CANCELLED:
        return State.CANCELLED
    if outcome in (Outcome.TIMEOUT, Outcome.INIT_TIMEOUT):
        return State.TIMED_OUT
    if evaluator_error or outcome is not Outcome.EXITED or exit_code != 0:
        return State.FAILED
    return State.COMPLETED


# A postrun claimed this often without ending the session is ended without scoring (``_give_up``).
MAX_POSTRUN_CLAIMS = 3

# Engine answers that mean the engine failed the call (unreachable, 5xx, timed out), as the proxy records them.
ENGINE_FAILURE_STATUSES = (502, 503, 504)


def call_evidence(services: Services, session: Session) -> CallEvidence:
    """What happened to the session's calls, for ``refine``: when its last delivered answer was recorded, the calls
    the engine failed (by ``failure_kind``) and those the proxy refused because of the infrastructure (a pause, a
    database outage; what Redis counted while the database was away is folded into ``call_refusals`` first), each
    kind with its count and its last time."""
    fold_in(services.db, services.config.redis_url, session.id, session.proxy_key_hash)
    with services.db.unit() as db:
        last_answer = last_answer_at(db, session.id)
        failed = engine_failures(db, session.id, ENGINE_FAILURE_STATUSES)
        refused = db.execute(
            sa.select(CallRefusal.reason, CallRefusal.count, CallRefusal.last_at).where(
                CallRefusal.session_id == session.id, CallRefusal.reason.in_(INFRASTRUCTURE_REASONS)
            )
        ).all()
    disruptions = [Disruption("engine", kind, int(count), at) for kind, count, at in failed]
    disruptions += [Disruption("proxy", reason, int(count), at) for reason, count, at in sorted(refused)]
    return CallEvidence(last_answer, tuple(disruptions))


@dataclass(frozen=True)
class _Scored:
    evaluation: Evaluation | None
    error: str | None
    runtime_failed: bool = False  # the evaluator's runtime broke under it: nothing was judged
    unscorable: bool = False  # the evaluator's own code failed: nothing was judged


def _is_reward(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _checked(evaluation: object) -> Evaluation:
    """The evaluator's answer, refused (``TypeError``: the evaluator's own bug) unless it is an ``Evaluation``
    whose rewards are finite numbers: a trainer never gets None, NaN or a string for a scored sample."""
    if not isinstance(evaluation, Evaluation) or not _is_reward(evaluation.reward):
        raise TypeError(f"the evaluator returned {evaluation!r}, not an Evaluation with a finite reward")
    if evaluation.trajectory_rewards is not None and not all(map(_is_reward, evaluation.trajectory_rewards)):
        raise TypeError(f"the evaluator's trajectory_rewards {evaluation.trajectory_rewards!r} are not all finite")
    return evaluation


def _failed_work(claimed: Claimed, exc: EvaluationError | UnsafePath | None, error: str) -> _Scored:
    """The work broke, hung or tampered with its judging: the task's failure, scored ``failure_reward``."""
    details = dict(exc.details) if isinstance(exc, EvaluationError) else {}
    details["failed"] = error
    return _Scored(Evaluation(reward=claimed.task.failure_reward, details=details), error)


def _evaluate(
    services: Services,
    claimed: Claimed,
    outcome: Outcome,
    runtimes: _Runtimes,
    calls: Sequence[CapturedCall],
    trajectories: Sequence[TrajectoryData],
) -> _Scored:
    session = claimed.session
    context = EvaluationContext(
        session_id=session.id,
        task=claimed.task,
        outcome=outcome,
        exit_code=session.exit_code,
        runtime=runtimes.session,
        calls=calls,
        trajectories=trajectories,
        remaining_s=max(0.0, claimed.remaining_s),
        fresh_runtime=runtimes.evaluator,
        final_message=final_message(services, session.id, answer_call(calls, trajectories)),
    )
    try:
        evaluator = load_evaluator(claimed.task.evaluator, services.config.plugin_modules)
        return _Scored(_checked(evaluator.evaluate(context)), None)
    except Exception as exc:
        error = f"evaluator {claimed.task.evaluator.name!r} failed: {type(exc).__name__}: {exc}"
        if isinstance(exc, EvaluationError | UnsafePath):
            return _failed_work(claimed, exc, error)
        if isinstance(exc, RuntimeFailure):
            return _Scored(None, error, runtime_failed=True)
        return _Scored(None, error, unscorable=True)


@dataclass(frozen=True)
class _Runtimes:
    session: Runtime | None
    evaluator: Runtime | None

    def destroy(self) -> None:
        for runtime in (self.session, self.evaluator):
            if runtime is not None:
                runtime.destroy()


def _attach(services: Services, handle: dict[str, Any] | None) -> Runtime | None:
    if not handle:
        return None
    try:
        return attach_runtime(handle, services.config)
    except RuntimeFailure:
        return None


def _runtimes_here(services: Services, session: Session) -> _Runtimes | None:
    """The session's runtimes, or None when another node holds them (a lost node's session finished here)."""
    if session.node is not None and session.node != services.config.node:
        return None
    return _Runtimes(_attach(services, session.runtime_handle), _attach(services, session.evaluator_runtime_handle))


@dataclass(frozen=True)
class _Ending:
    outcome: Outcome
    error: str | None
    scored: _Scored
    # For a task outcome, the calls the policy acted in (``attempts.class_of``; None: the outcome alone decides).
    acted: int | None = None

    @property
    def outcome_class(self) -> OutcomeClass:
        if self.acted is None:
            return classify(self.outcome)
        return class_of(self.outcome, self.acted)


def _settle(db: Any, services: Services, claimed: Claimed, ending: _Ending) -> bool:
    """After the terminal compare-and-set: start the sample's next attempt (True) when the infrastructure lost
    this one and attempts are left, else give the session its feed position (the sample is settled)."""
    session = claimed.session
    # Read under a lock on the batch's row that waits for a cancel's (``cancel_batch`` takes it FOR UPDATE): read
    # after a cancel commits, the flag is seen; read first, the cancel waits, and its UPDATE of the pending
    # sessions sees the attempt inserted here. FOR KEY SHARE is what inserting that attempt takes anyway (its
    # foreign key): other postruns of the batch, and its ``finished_at``, are not held up.
    # A batch its circuit breaker halted starts no more attempts either (polar.stages.circuit_breaker), nor a group
    # stopped early (polar.stages.early_stop).
    flags = sa.select(Batch.cancel_requested_at, Batch.halted_at).where(Batch.id == session.batch_id)
    cancelled = any(value is not None for value in db.execute(flags.with_for_update(read=True, key_share=True)).one())
    cancelled = cancelled or db.scalar(sa.select(Task.stopped_at).where(Task.id == session.task_pk)) is not None
    retry = (
        ending.outcome_class is OutcomeClass.INFRASTRUCTURE
        and retries_left(session.attempt, claimed.task.max_attempts)
        and not cancelled
    )
    if retry:
        start_next_attempt(db, session, services, ending.outcome.value)
    else:
        assign_position(db, session.id)
        early = claimed.task.early_stop
        if early is not None and ending.outcome_class is OutcomeClass.TASK:
            stop_if_enough(db, services, session, early.min_usable)
    # After the retry: a halt cancels it with the batch's other unstarted sessions (polar.stages.circuit_breaker).
    count_attempt(db, services, session.batch_id, ending.outcome_class, ending.outcome.value)
    return retry


def _event_detail(ending: _Ending) -> str | None:
    """What the terminal event says of an attempt that is not training signal."""
    if ending.outcome_class is OutcomeClass.INFRASTRUCTURE:
        return ending.outcome.value
    if ending.outcome_class is OutcomeClass.EXCLUDED:
        return f"{ending.outcome.value}, excluded: the harness got no model answer (the policy never acted)"
    return None


def _store(
    services: Services, claimed: Claimed, trajectories: Sequence[TrajectoryData], ending: _Ending
) -> bool | None:
    """The terminal transaction; None when another worker ended the session first, else whether a next attempt
    was started.

    The evaluation's details and the error quote what the harness, the evaluator's commands and the model wrote:
    they are stored made storable (``polar.codec.json_body.storable``); a store the database still refuses is tried
    once more with the trajectories' text made storable too (``polar.storage.storable``). Token ids, loss masks
    and logprobs are numbers: never changed."""
    session = claimed.session
    evaluation, evaluator_error = ending.scored.evaluation, ending.scored.error
    state = final_state(ending.outcome, session.exit_code, evaluator_error)
    reward = evaluation.reward if evaluation else None
    per_trajectory = list(evaluation.trajectory_rewards or []) if evaluation else []
    details = storable(dict(evaluation.details)) if evaluation else None
    error = ending.error or evaluator_error
    error = storable_text(error) if error is not None else None

    def store(clean: bool) -> bool | None:
        with services.db.unit() as db:
            moved = transition(
                db,
                session.id,
                State.POSTRUN,
                state,
                by=services,
                detail=evaluator_error or _event_detail(ending),
                where=[claimed.held],
                reward=reward,
                evaluation=details,
                error=error,
                outcome=ending.outcome.value,
                outcome_class=ending.outcome_class.value,
            )
            if not moved:
                return None
            db.execute(sa.delete(Trajectory).where(Trajectory.session_id == session.id))
            for position, trajectory in enumerate(trajectories):
                db.add(
                    Trajectory(
                        session_id=session.id,
                        position=position,
                        agent=storable_text(trajectory.agent) if clean and trajectory.agent else trajectory.agent,
                        reconstruction=claimed.task.reconstruction,
                        token_ids=trajectory.token_ids,
                        loss_mask=trajectory.loss_mask,
                        logprobs=trajectory.logprobs,
                        call_ids=trajectory.call_ids,
                        reward=per_trajectory[position] if position < len(per_trajectory) else reward,
                        stats=storable(trajectory.stats) if clean else trajectory.stats,
                        main=trajectory.main,
                        segment=storable(trajectory.segment) if clean and trajectory.segment else trajectory.segment,
                        media=trajectory.media or None,
                    )
                )
            retried = _settle(db, services, claimed, ending)
            finished = mark_batch_finished(db, session.batch_id)
            if not retried:  # the sample settled: the group or the batch it completes owes its callbacks
                record_session_events(db, session.id, finished)
        return retried

    return storing(store, f"session {session.id}'s end")


def _ending(
    services: Services,
    claimed: Claimed,
    runtimes: _Runtimes | None,
    calls: Sequence[CapturedCall],
    trajectories: Sequence[TrajectoryData],
) -> _Ending:
    """How the attempt really ended: the engine's failures and the evaluator's runtime taken into account; only
    an attempt with a task outcome is scored."""
    session = claimed.session
    recorded = Outcome(session.outcome or Outcome.ERROR.value)
    evidence = call_evidence(services, session)
    outcome = refine(recorded, session.exit_code, evidence, False)
    error = session.error
    if outcome is Outcome.ENGINE_FAILED and recorded is not Outcome.ENGINE_FAILED:
        error = f"{evidence.explained()}; {error or recorded.value}"
    if classify(outcome) is not OutcomeClass.TASK:  # lost to the infrastructure, or cancelled: never scored
        return _Ending(outcome, error, _Scored(None, None))
    scored = _evaluate(services, claimed, outcome, runtimes or _Runtimes(None, None), calls, trajectories)
    if refine(outcome, session.exit_code, evidence, scored.runtime_failed) is Outcome.RUNTIME_FAILED:
        return _Ending(Outcome.RUNTIME_FAILED, error or scored.error, _Scored(None, scored.error, runtime_failed=True))
    if scored.unscorable:
        return _Ending(Outcome.UNSCORABLE, error or scored.error, _Scored(None, scored.error, unscorable=True))
    return _Ending(outcome, error, scored, acted=len(calls) + evidence.generation_timeouts())


def _give_up(claimed: Claimed) -> _Ending:
    """Postrun was claimed more than ``MAX_POSTRUN_CLAIMS`` times: each try died (a killed worker, memory, a
    crash) before it ended the session. End it now, unscored, as Polar's own failure (so the sample is retried)."""
    tries = claimed.session.postrun_claims - 1
    error = f"postrun did not finish in {tries} tries (its worker died or failed each time); ended unscored"
    return _Ending(Outcome.ERROR, f"{error}; {claimed.session.error}" if claimed.session.error else error,
                   _Scored(None, None))  # fmt: skip


def postrun_session(services: Services, session_id: uuid.UUID) -> None:
    claimed = claim(services, session_id, State.POSTRUN, postrun_claims=Session.postrun_claims + 1)
    if claimed is None:
        return
    tries = claimed.session.postrun_claims
    with heartbeat(services, session_id, claimed.lease):
        calls, trajectories = [], []
        if tries <= MAX_POSTRUN_CLAIMS + 1:  # beyond that, rebuilding the trajectories is what keeps failing
            calls = captured_calls(services, session_id)
            trajectories = RECONSTRUCTIONS[claimed.task.reconstruction](calls)
            with services.db.unit() as db:  # breaks explained, main chain and segments marked
                trajectories = annotate(
                    db, session_id, calls, trajectories, claimed.task.reconstruction, claimed.task.segments
                )
        runtimes = _runtimes_here(services, claimed.session)
        if runtimes is not None and runtimes.session is not None:
            runtimes.session.kill_processes()
        if tries > MAX_POSTRUN_CLAIMS:
            ending = _give_up(claimed)
        else:
            ending = _ending(services, claimed, runtimes, calls, trajectories)
        retried = _store(services, claimed, trajectories, ending)
        if retried is None:
            return
    if retried:
        admit(services)
    if runtimes is None:
        return  # another node's runtimes: its own reconciler tears them down
    runtimes.destroy()
    with services.db.unit() as db:
        db.execute(
            sa.update(Session)
            .where(Session.id == session_id)
            .values(runtime_handle=None, evaluator_runtime_handle=None)
        )
