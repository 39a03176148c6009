"""Rows to the JSON the rollout API returns (DESIGN.md §5 field names).

The ``...JSON`` TypedDicts are that JSON's contract: the functions here are typed with them, and
``web.api.openapi`` turns them into the response schemas of ``/openapi.json`` (closed objects: a key added here
and not there fails the schemathesis run, and the type check catches the reverse).
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Annotated, Any, Literal, NotRequired, cast

from pydantic import ConfigDict, WithJsonSchema, with_config
from sqlalchemy import Row
from typing_extensions import TypedDict  # pydantic reads TypedDicts from typing_extensions on Python < 3.12

from polar.clock import as_utc, iso
from polar.storage.calls.read import WholeCall
from polar.storage.models import Batch, Session, Trajectory

UUIDString = Annotated[str, WithJsonSchema({"type": "string", "format": "uuid"})]
Timestamp = Annotated[str, WithJsonSchema({"type": "string", "format": "date-time"})]
_CLOSED = ConfigDict(extra="forbid")
BatchStatus = Literal["pending", "running", "finished"]


@with_config(_CLOSED)
class AttemptsJSON(TypedDict):
    retried: int  # attempts the infrastructure lost that were retried
    out_of_attempts: int  # samples whose last attempt the infrastructure lost


@with_config(_CLOSED)
class BatchJSON(TypedDict):
    batch_id: UUIDString
    name: str | None
    status: BatchStatus
    num_sessions: int
    counts: dict[str, int]  # state -> samples, each by its latest attempt
    attempts: AttemptsJSON
    created_at: Timestamp
    finished_at: Timestamp | None
    provenance: dict[str, Any] | None
    # Its circuit breaker (max_consecutive_infra_losses): when it stopped admitting and why; None while it admits.
    halted_at: NotRequired[Timestamp | None]
    halted_reason: NotRequired[str | None]


@with_config(_CLOSED)
class TimeJSON(TypedDict):
    """Where a session's time went (``time_record``): each null until the session got that far."""

    queued_s: float | None  # submitted, waiting for admission
    init_s: float | None  # its runtime made and its prepare steps run
    ready_s: float | None  # prepared, waiting for a run slot
    engine_gate_s: float | None  # run slot taken, waiting for an engine to answer before the harness starts
    harness_s: float | None  # the harness ran
    model_calls_s: float | None  # of that, in answered model calls (their sum: parallel calls add up)
    between_calls_s: float | None  # of that, outside model calls: the tools, the harness itself
    paused_s: float | None  # budget given back for weight-sync pauses that held it
    postrun_s: float | None  # reconstruction, evaluation, teardown
    total_s: float | None  # submitted to ended


@with_config(_CLOSED)
class TimingsJSON(TypedDict):
    pending_s: float | None
    init_s: float | None
    ready_s: float | None
    run_s: float | None
    postrun_s: float | None
    total_s: float | None


@with_config(_CLOSED)
class SessionJSON(TypedDict):
    session_id: UUIDString
    batch_id: UUIDString
    task_id: str
    sample_index: int
    attempt: int
    max_attempts: int | None
    state: str
    outcome: str | None
    outcome_class: str | None
    retry_of: UUIDString | None
    retried_as: UUIDString | None
    reward: float | None
    exit_code: int | None
    error: str | None
    evaluation: dict[str, Any] | None
    num_calls: int
    worker: str | None
    node: str | None
    created_at: Timestamp
    finished_at: Timestamp | None
    timings: TimingsJSON
    # Where its time went, finer than ``timings``: one session's JSON only (``GET /v1/sessions/<id>``).
    time: NotRequired[TimeJSON]


@with_config(_CLOSED)
class SessionPageJSON(TypedDict):
    items: list[SessionJSON]
    total: int
    next_offset: int | None  # the ``offset`` of the next page; None on the last page or when reading by ``after``
    next_after: str | None  # the ``after`` of the next page (a keyset cursor); None on the last page


@with_config(_CLOSED)
class CallJSON(TypedDict):
    call_id: UUIDString
    session_id: UUIDString
    seq: int
    agent: str | None
    provider: str
    model: str | None
    stream: bool
    prompt_token_ids: list[int]
    completion_token_ids: list[int]
    logprobs: list[float]
    finish_reason: str | None
    status_code: int
    latency_ms: float
    engine_latency_ms: float | None
    policy_version: str | None  # the policy version the call started under
    policy_version_end: str | None  # the one it ended under
    spans_policy_update: bool  # they differ: its sampled tokens came from two policies
    engine_kind: str | None  # vllm | sglang
    request: dict[str, Any]
    normalized_request: dict[str, Any]
    response: dict[str, Any]
    created_at: Timestamp
    prompt_parent_id: UUIDString | None
    prompt_prefix_len: int
    delivered: bool  # False: captured, but the answer never reached the harness (left out of trajectories)
    # vLLM's per-token expert routing (base64 .npy, shape (prompt + completion - 1, layers, experts per token));
    # None but for mixture-of-experts models served with --enable-return-routed-experts.
    routed_experts: str | None
    # The sampling parameters the harness asked for and the ones the engine was sent (polar.proxy.sampling); None
    # for calls stored before they were recorded.
    sampling: dict[str, Any] | None
    synthesized: bool  # True: Polar's final stop reply over the call budget (over_budget: stop), not model tokens
    # Its images in prompt order (polar.storage.media): sha256, media_type, message_index, source, offset and length
    # in prompt_token_ids, …; [] without images. Its payloads hold references in place of the images' base64.
    media: list[dict[str, Any]]


@with_config(_CLOSED)
class CallPageJSON(TypedDict):
    items: list[CallJSON]
    next_after: int | None  # the ``after`` of the next page (a ``seq``); None on the last page


@with_config(_CLOSED)
class TrajectoryJSON(TypedDict):
    trajectory_id: UUIDString
    session_id: UUIDString
    agent: str | None
    reconstruction: str
    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    call_ids: list[str]
    reward: float | None
    stats: dict[str, Any]
    # The session's main chain (its first call's agent and what continues it), not a side call: a title request, a
    # tool's own use of the key, another agent (docs/training-data.md). Absent from feed items of trajectories
    # stored before Polar marked it (migration 0021), which were all taken as main.
    main: NotRequired[bool]
    # Its segment of the session's rollout (``polar.reconstruction.segments``): ``index``, ``edge``, ``parent``,
    # ``call_id``, ``tool_call_id``, ``evidence``, ``trainable``; None for trajectories stored before migration 0022.
    segment: NotRequired[dict[str, Any] | None]
    # Its images' spans (``polar.storage.media``): ``sha256``, ``call_id``, ``offset`` and ``length`` in
    # ``token_ids``, ``media_type``; [] without images (and for trajectories stored before migration 0023).
    media: NotRequired[list[dict[str, Any]]]
    # Per call of ``call_ids``, its expert routing (``CallJSON.routed_experts``); None when no call has any. The
    # last call of a prefix-merged trajectory routes every token of the trajectory but the last.
    routed_experts: list[str | None] | None


@with_config(_CLOSED)
class EventJSON(TypedDict):
    at: Timestamp
    from_state: str | None  # None for the first event (submission)
    to_state: str
    node: str
    worker: str | None
    detail: str | None
    duration_s: float | None  # time in ``to_state``, until the next event; None for the latest


@with_config(_CLOSED)
class SessionEventsJSON(TypedDict):
    session_id: UUIDString
    items: list[EventJSON]
    seconds_in: dict[str, float]  # state -> seconds spent in it, over every entry into it
    total_s: float | None  # first event to latest


class FeedItemJSON(TrajectoryJSON):
    """A trajectory in the trainers' feed, with its session's place (``polar.training.feed``)."""

    batch_id: UUIDString
    task_id: str
    sample_index: int
    attempt: int
    group_id: str
    group_size: int
    group_scored: int  # the group's samples scored so far (each by its latest attempt; task outcomes only)
    # Why each of the others is missing: "cancelled", "out_of_attempts", "pending" -> count; {} when all are scored.
    group_missing: dict[str, int]
    state: str
    feed_position: int


def _stamp(moment: datetime) -> str:
    stamped = iso(moment)
    assert stamped is not None  # a NOT NULL column
    return stamped


def _seconds(start: Any, end: Any) -> float | None:
    start, end = as_utc(start), as_utc(end)
    return round((end - start).total_seconds(), 3) if start and end else None


def batch_json(batch: Batch, status: str, counts: dict[str, int], attempts: dict[str, int] | None = None) -> BatchJSON:
    """``counts``: sessions per state, each sample once (its latest attempt); ``attempts``: how many attempts the
    infrastructure lost (``retried``) and how many samples ran out of attempts (``out_of_attempts``)."""
    return {
        "batch_id": str(batch.id),
        "name": batch.name,
        "status": cast(BatchStatus, status),  # polar.lifecycle.batches.overall_status says which
        "num_sessions": batch.num_sessions,
        "counts": counts,
        "attempts": {
            "retried": (attempts or {}).get("retried", 0),
            "out_of_attempts": (attempts or {}).get("out_of_attempts", 0),
        },
        "created_at": _stamp(batch.created_at),
        "finished_at": iso(batch.finished_at),
        # What produced the results (polar.records.provenance): Polar's version, configuration digest, engines.
        "provenance": batch.provenance,
        "halted_at": iso(batch.halted_at),
        "halted_reason": batch.halted_reason,
    }


def time_record(session: Session, timeout_s: float | None, model_calls_s: float | None) -> TimeJSON:
    """Where ``session``'s time went, from its stage stamps, its task's budget (``timeout_s``: what a deadline
    beyond it was given back for pauses) and its answered calls' summed latency."""
    harness = _seconds(session.budget_started_at, session.run_finished_at)
    paused = None
    if session.deadline_at is not None and session.budget_started_at is not None and timeout_s is not None:
        paused = max(0.0, (session.deadline_at - session.budget_started_at).total_seconds() - timeout_s)
    between = None if harness is None or model_calls_s is None else max(0.0, harness - model_calls_s)
    return {
        "queued_s": _seconds(session.created_at, session.init_started_at),
        "init_s": _seconds(session.init_started_at, session.ready_at),
        "ready_s": _seconds(session.ready_at, session.run_started_at),
        "engine_gate_s": _seconds(session.run_started_at, session.budget_started_at),
        "harness_s": harness,
        "model_calls_s": model_calls_s if session.run_started_at is not None else None,
        "between_calls_s": between,
        "paused_s": paused,
        "postrun_s": _seconds(session.postrun_started_at, session.finished_at),
        "total_s": _seconds(session.created_at, session.finished_at),
    }


def session_json(session: Session, max_attempts: int | None = None) -> SessionJSON:
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
        "created_at": _stamp(session.created_at),
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


def call_json(call: Any, whole: WholeCall) -> CallJSON:
    """``call`` is a ``model_calls`` row; ``whole`` its full prompt and payloads (``polar.storage.calls.read``): the
    row stores them as deltas on earlier calls."""
    return {
        "call_id": str(call.id),
        "session_id": str(call.session_id),
        "seq": call.seq,
        "agent": call.agent,
        "provider": call.provider,
        "model": call.model,
        "stream": call.stream,
        "prompt_token_ids": whole.prompt_token_ids,
        "completion_token_ids": list(call.completion_token_ids),
        "logprobs": list(call.logprobs),
        "finish_reason": call.finish_reason,
        "status_code": call.status_code,
        "latency_ms": call.latency_ms,
        "engine_latency_ms": call.engine_latency_ms,
        "policy_version": call.policy_version,
        "policy_version_end": call.policy_version_end,
        "spans_policy_update": bool(call.spans_policy_update),
        "engine_kind": call.engine_kind,
        "request": whole.request,
        "normalized_request": whole.normalized_request,
        "response": whole.response,
        "created_at": _stamp(call.created_at),
        "prompt_parent_id": str(call.prompt_parent_id) if call.prompt_parent_id else None,
        "prompt_prefix_len": call.prompt_prefix_len,
        "delivered": call.delivered,
        "routed_experts": _base64(call.routed_experts),
        "sampling": call.sampling,
        "synthesized": bool(call.synthesized),
        "media": call.media or [],
    }


def trajectory_json(
    trajectory: Trajectory | Row[Any], routed: Mapping[uuid.UUID, bytes] | None = None
) -> TrajectoryJSON:
    """A stored trajectory (the model, or a row of its table's columns); ``routed``: the expert routing of the calls
    that have any (``routed_experts_of_sessions``)."""
    whole = {**stored_trajectory_json(trajectory), "routed_experts": routed_json(trajectory.call_ids, routed)}
    return cast(TrajectoryJSON, whole)


def routed_json(call_ids: Sequence[Any], routed: Mapping[uuid.UUID, bytes] | None) -> list[str | None] | None:
    """A trajectory's expert routing, one base64 ``.npy`` per call (None for a call without); None without any."""
    per_call = [routed.get(uuid.UUID(str(call_id))) for call_id in call_ids] if routed else []
    return [_base64(b) for b in per_call] if any(per_call) else None


def stored_trajectory_json(trajectory: Trajectory | Row[Any]) -> dict[str, Any]:
    """``trajectory_json`` without the expert routing: what the ``trajectories`` row itself holds (the feed has
    Postgres write the same JSON, ``polar.training.feed``)."""
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
        "main": bool(trajectory.main),
        "segment": trajectory.segment,
        "media": trajectory.media or [],
    }


def _base64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode("ascii")
