"""Stage ``postrun``: always entered. Rebuild trajectories from the captured calls, evaluate, store the reward,
end the session in its terminal state, then tear the runtimes down (the session's, and the evaluator's clean one
when it had one).

The terminal compare-and-set, the trajectory rows and the reward commit in one transaction, so a redelivered
postrun can never leave duplicate trajectories.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from polar.errors import RuntimeFailure
from polar.evaluators import Evaluation, EvaluationContext, load_evaluator
from polar.lifecycle.batches import mark_batch_finished
from polar.lifecycle.states import Outcome, State
from polar.lifecycle.transitions import transition
from polar.reconstruction import RECONSTRUCTIONS, CapturedCall, TrajectoryData
from polar.runtimes import Runtime, attach_runtime
from polar.services import Services
from polar.stages.lease import Claimed, claim, heartbeat
from polar.storage.models import ModelCall, Session, Trajectory
from polar.storage.prompts import full_prompts
from polar.training.callbacks import after_session_ended
from polar.training.feed import assign_position


def captured_calls(services: Services, session_id: uuid.UUID) -> list[CapturedCall]:
    """The session's successful calls in ``seq`` order, with full prompts (stored as deltas, see
    ``polar.storage.prompts``)."""
    with services.db.unit() as db:
        rows = db.execute(
            sa.select(
                ModelCall.id,
                ModelCall.seq,
                ModelCall.agent,
                ModelCall.prompt_parent_id,
                ModelCall.prompt_prefix_len,
                ModelCall.prompt_token_ids,
                ModelCall.completion_token_ids,
                ModelCall.logprobs,
                ModelCall.finish_reason,
            )
            .where(ModelCall.session_id == session_id, ModelCall.status_code == 200)
            .order_by(ModelCall.seq)
        ).all()
    prompts = full_prompts(rows)
    return [
        CapturedCall(str(r.id), r.seq, r.agent, prompts[r.id], r.completion_token_ids, r.logprobs, r.finish_reason)
        for r in rows
    ]


def final_message(services: Services, session_id: uuid.UUID) -> str | None:
    """The text of the model's last answer: the last successful call's assistant message (captured calls keep
    the engine's chat-shaped response)."""
    with services.db.unit() as db:
        response = db.scalar(
            sa.select(ModelCall.response)
            .where(ModelCall.session_id == session_id, ModelCall.status_code == 200)
            .order_by(ModelCall.seq.desc())
            .limit(1)
        )
    choices = (response or {}).get("choices") or []
    message = choices[0].get("message") if choices and isinstance(choices[0], dict) else None
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, list):  # content parts
        content = "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return content if isinstance(content, str) else None


def final_state(outcome: Outcome, exit_code: int | None, evaluator_error: str | None) -> State:
    if outcome is Outcome.CANCELLED:
        return State.CANCELLED
    if outcome is Outcome.TIMEOUT:
        return State.TIMED_OUT
    if evaluator_error or outcome is not Outcome.EXITED or exit_code != 0:
        return State.FAILED
    return State.COMPLETED


def _evaluate(
    services: Services,
    claimed: Claimed,
    runtimes: _Runtimes,
    calls: Sequence[CapturedCall],
    trajectories: Sequence[TrajectoryData],
) -> tuple[Evaluation | None, str | None]:
    session = claimed.session
    context = EvaluationContext(
        session_id=session.id,
        task=claimed.task,
        outcome=Outcome(session.outcome or Outcome.ERROR.value),
        exit_code=session.exit_code,
        runtime=runtimes.session,
        calls=calls,
        trajectories=trajectories,
        remaining_s=max(0.0, claimed.remaining_s),
        fresh_runtime=runtimes.evaluator,
        final_message=final_message(services, session.id),
    )
    try:
        return load_evaluator(claimed.task.evaluator).evaluate(context), None
    except Exception as exc:
        return None, f"evaluator {claimed.task.evaluator.name!r} failed: {type(exc).__name__}: {exc}"


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


def _store(
    services: Services,
    claimed: Claimed,
    trajectories: Sequence[TrajectoryData],
    evaluation: Evaluation | None,
    evaluator_error: str | None,
) -> bool:
    session = claimed.session
    state = final_state(Outcome(session.outcome or Outcome.ERROR.value), session.exit_code, evaluator_error)
    reward = evaluation.reward if evaluation else None
    per_trajectory = list(evaluation.trajectory_rewards or []) if evaluation else []
    with services.db.unit() as db:
        moved = transition(
            db,
            session.id,
            State.POSTRUN,
            state,
            worker=services.worker,
            detail=evaluator_error,
            where=[Session.worker == services.worker],
            reward=reward,
            evaluation=dict(evaluation.details) if evaluation else None,
            error=session.error or evaluator_error,
        )
        if not moved:
            return False
        db.execute(sa.delete(Trajectory).where(Trajectory.session_id == session.id))
        for position, trajectory in enumerate(trajectories):
            db.add(
                Trajectory(
                    session_id=session.id,
                    position=position,
                    agent=trajectory.agent,
                    reconstruction=claimed.task.reconstruction,
                    token_ids=trajectory.token_ids,
                    loss_mask=trajectory.loss_mask,
                    logprobs=trajectory.logprobs,
                    call_ids=trajectory.call_ids,
                    reward=per_trajectory[position] if position < len(per_trajectory) else reward,
                    stats=trajectory.stats,
                )
            )
        assign_position(db, session.id)
        mark_batch_finished(db, session.batch_id)
    return True


def postrun_session(services: Services, session_id: uuid.UUID) -> None:
    claimed = claim(services, session_id, State.POSTRUN)
    if claimed is None:
        return
    with heartbeat(services, session_id, State.POSTRUN):
        calls = captured_calls(services, session_id)
        trajectories = RECONSTRUCTIONS[claimed.task.reconstruction](calls)
        session = claimed.session
        runtimes = _Runtimes(
            _attach(services, session.runtime_handle), _attach(services, session.evaluator_runtime_handle)
        )
        if runtimes.session is not None:
            runtimes.session.kill_processes()
        evaluation, evaluator_error = _evaluate(services, claimed, runtimes, calls, trajectories)
        if not _store(services, claimed, trajectories, evaluation, evaluator_error):
            return
    after_session_ended(services, session_id)
    runtimes.destroy()
    with services.db.unit() as db:
        db.execute(
            sa.update(Session)
            .where(Session.id == session_id)
            .values(runtime_handle=None, evaluator_runtime_handle=None)
        )
