"""Rows to the JSON the rollout API returns (DESIGN.md §5 field names)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from polar.clock import as_utc, iso
from polar.storage.models import Batch, ModelCall, Session, Trajectory


def _seconds(start: Any, end: Any) -> float | None:
    start, end = as_utc(start), as_utc(end)
    return round((end - start).total_seconds(), 3) if start and end else None


def batch_json(
    batch: Batch, status: str, counts: dict[str, int], attempts: dict[str, int] | None = None
) -> dict[str, Any]:
    """``counts``: sessions per state, each sample once (its latest attempt); ``attempts``: how many attempts the
    infrastructure lost (``retried``) and how many samples ran out of attempts (``out_of_attempts``)."""
    return {
        "batch_id": str(batch.id),
        "name": batch.name,
        "status": status,
        "num_sessions": batch.num_sessions,
        "counts": counts,
        "attempts": attempts or {"retried": 0, "out_of_attempts": 0},
        "created_at": iso(batch.created_at),
        "finished_at": iso(batch.finished_at),
        # What produced the results (polar.records.provenance): Polar's version, configuration digest, engines.
        "provenance": batch.provenance,
    }


def session_json(session: Session, max_attempts: int | None = None) -> dict[str, Any]:
    """``max_attempts``: the task's bound on attempts per sample, when the caller read the task."""
    return {
        "session_id": str(session.id),
        "batch_id": str(session.batch_id),
        "task_id": session.task_id,
        "sample_index": session.sample_index,
        "attempt": session.attempt,
        "max_attempts": max_attempts,
        "state": session.state,
        "outcome": session.outcome,
        "outcome_class": session.outcome_class,
        "retry_of": str(session.retry_of) if session.retry_of else None,
        "retried_as": str(session.retried_as) if session.retried_as else None,
        "reward": session.reward,
        "exit_code": session.exit_code,
        "error": session.error,
        "evaluation": session.evaluation,
        "num_calls": session.num_calls,
        "worker": session.worker,
        "node": session.node,
        "created_at": iso(session.created_at),
        "finished_at": iso(session.finished_at),
        "timings": {
            "pending_s": _seconds(session.created_at, session.init_started_at),
            "init_s": _seconds(session.init_started_at, session.ready_at),
            "ready_s": _seconds(session.ready_at, session.run_started_at),
            "run_s": _seconds(session.run_started_at, session.run_finished_at or session.postrun_started_at),
            "postrun_s": _seconds(session.postrun_started_at, session.finished_at),
            "total_s": _seconds(session.init_started_at, session.finished_at),
        },
    }


def call_json(call: ModelCall, prompt_token_ids: Sequence[int]) -> dict[str, Any]:
    """``prompt_token_ids`` is the call's full prompt (``polar.storage.prompts.full_prompts``); the row stores
    only the tokens after ``prompt_prefix_len``, taken from ``prompt_parent_id``."""
    return {
        "call_id": str(call.id),
        "session_id": str(call.session_id),
        "seq": call.seq,
        "agent": call.agent,
        "provider": call.provider,
        "model": call.model,
        "stream": call.stream,
        "prompt_token_ids": list(prompt_token_ids),
        "completion_token_ids": list(call.completion_token_ids),
        "logprobs": list(call.logprobs),
        "finish_reason": call.finish_reason,
        "status_code": call.status_code,
        "latency_ms": call.latency_ms,
        "engine_latency_ms": call.engine_latency_ms,
        "policy_version": call.policy_version,
        "request": call.request,
        "normalized_request": call.normalized_request,
        "response": call.response,
        "created_at": iso(call.created_at),
        "prompt_parent_id": str(call.prompt_parent_id) if call.prompt_parent_id else None,
        "prompt_prefix_len": call.prompt_prefix_len,
    }


def trajectory_json(trajectory: Trajectory) -> dict[str, Any]:
    return {
        "trajectory_id": str(trajectory.id),
        "session_id": str(trajectory.session_id),
        "agent": trajectory.agent,
        "reconstruction": trajectory.reconstruction,
        "token_ids": list(trajectory.token_ids),
        "loss_mask": list(trajectory.loss_mask),
        "logprobs": list(trajectory.logprobs),
        "call_ids": [str(c) for c in trajectory.call_ids],
        "reward": trajectory.reward,
        "stats": trajectory.stats,
    }
