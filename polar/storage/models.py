"""The system of record (DESIGN.md §7) as SQLAlchemy 2 models.

Token sequences and logprobs are Postgres arrays (JSON on SQLite). Ids are UUIDs, except ``session_events``
which is an append-only log keyed by a bigint identity. The Alembic migration in ``migrations/`` creates exactly
this schema (a test compares them).
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from polar.storage.columns import int_array, json_document, real_array, small_int_array, text_array, verbatim_json

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = sa.MetaData(naming_convention=NAMING)


def _partial_index(name: str, *columns: Any, where: str) -> sa.Index:
    """An index of the rows where ``where`` holds, on Postgres and SQLite alike (the one condition, written once)."""
    return sa.Index(name, *columns, postgresql_where=sa.text(where), sqlite_where=sa.text(where))


def _uuid() -> Mapped[uuid.UUID]:
    return mapped_column(sa.Uuid(), primary_key=True, default=uuid.uuid4)


def _created() -> Mapped[datetime]:
    return mapped_column(sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now())


class Batch(Base):
    __tablename__ = "batches"

    id: Mapped[uuid.UUID] = _uuid()
    name: Mapped[str | None] = mapped_column(sa.Text())
    defaults: Mapped[dict[str, Any]] = mapped_column(json_document(), nullable=False, default=dict)
    idempotency_key: Mapped[str | None] = mapped_column(sa.Text(), unique=True)
    request_hash: Mapped[str] = mapped_column(sa.Text(), nullable=False)
    num_sessions: Mapped[int] = mapped_column(sa.Integer(), nullable=False)
    created_at: Mapped[datetime] = _created()
    finished_at: Mapped[datetime | None] = mapped_column(sa.DateTime(timezone=True))
    cancel_requested_at: Mapped[datetime | None] = mapped_column(sa.DateTime(timezone=True))
    callback_url: Mapped[str | None] = mapped_column(sa.Text())
    # Who submitted it (the API token's role and fingerprint) and what produced its results: Polar's version,
    # the configuration digest, the engines' served models and versions (polar.records.provenance).
    submitted_by: Mapped[str | None] = mapped_column(sa.Text())
    provenance: Mapped[dict[str, Any] | None] = mapped_column(json_document())
    # The circuit breaker (polar.stages.circuit_breaker): after this many attempts in a row lost to the
    # infrastructure the batch stops admitting, its unstarted sessions cancelled, and says why.
    max_consecutive_infra_losses: Mapped[int | None] = mapped_column(sa.Integer())
    infra_loss_streak: Mapped[int] = mapped_column(sa.Integer(), nullable=False, default=0, server_default="0")
    halted_at: Mapped[datetime | None] = mapped_column(sa.DateTime(timezone=True))
    halted_reason: Mapped[str | None] = mapped_column(sa.Text())


class Task(Base):
    __tablename__ = "tasks"
    __table_args__ = (
        sa.UniqueConstraint("batch_id", "position"),
        _partial_index("ix_tasks_group_feed_seq", "group_feed_seq", where="group_feed_seq IS NOT NULL"),
        _partial_index(
            "ix_tasks_batch_id_group_feed_seq", "batch_id", "group_feed_seq", where="group_feed_seq IS NOT NULL"
        ),
    )

    id: Mapped[uuid.UUID] = _uuid()
    batch_id: Mapped[uuid.UUID] = mapped_column(sa.ForeignKey("batches.id", ondelete="CASCADE"), nullable=False)
    position: Mapped[int] = mapped_column(sa.Integer(), nullable=False)
    task_id: Mapped[str] = mapped_column(sa.Text(), nullable=False)
    num_samples: Mapped[int] = mapped_column(sa.Integer(), nullable=False)
    spec: Mapped[dict[str, Any]] = mapped_column(json_document(), nullable=False)
    # When its group stopped early (``early_stop``, polar.stages.early_stop): the rest of its samples cancelled.
    stopped_at: Mapped[datetime | None] = mapped_column(sa.DateTime(timezone=True))
    created_at: Mapped[datetime] = _created()
    # The feed position at which the task's group completed: its last sample settled (polar.training.feed).
    group_feed_seq: Mapped[int | None] = mapped_column(sa.BigInteger())


class Session(Base):
    __tablename__ = "sessions"
    __table_args__ = (
        # One row per attempt of a sample (polar.lifecycle.attempts).
        sa.UniqueConstraint("task_pk", "sample_index", "attempt"),
        sa.Index("ix_sessions_state_created_at", "state", "created_at"),
        # A batch's sessions in task, sample, attempt order: keyset pages at any depth (polar.lifecycle.sessions).
        sa.Index("ix_sessions_batch_id_task_position", "batch_id", "task_position", "sample_index", "attempt"),
        # A batch's progress and its number of sessions, read from the index alone (polar.lifecycle.batches).
        sa.Index("ix_sessions_batch_id_state", "batch_id", "state", postgresql_include=["retried_as", "outcome_class"]),
        _partial_index("ix_sessions_batch_id_retries", "batch_id", where="retry_of IS NOT NULL"),
        # One batch's feed among many (polar.training.feed).
        _partial_index("ix_sessions_batch_id_feed_seq", "batch_id", "feed_seq", where="feed_seq IS NOT NULL"),
        # Deleting a session (polar gc) makes Postgres look for attempts linked to it: without these, one scan of
        # the whole table per deleted session. Partial: few sessions are retries.
        _partial_index("ix_sessions_retry_of", "retry_of", where="retry_of IS NOT NULL"),
        _partial_index("ix_sessions_retried_as", "retried_as", where="retried_as IS NOT NULL"),
        _partial_index("ix_sessions_due_unsent", "due_at", where="due_stage IS NOT NULL AND stage_enqueued_at IS NULL"),
        # The sessions a weight-sync pause held: few, cleared at every resume (polar.lifecycle.budget).
        _partial_index("ix_sessions_pause_held_at", "pause_held_at", where="pause_held_at IS NOT NULL"),
        # The reconciler's sweep of ended sessions still holding runtimes, without reading the history (audit G15).
        _partial_index(
            "ix_sessions_runtime_held",
            "state",
            where="runtime_handle IS NOT NULL OR evaluator_runtime_handle IS NOT NULL",
        ),
        # A node's sessions by when they became ready or reached postrun: the lost-message checks' "overtaken"
        # lookups read the rows after one time, not the node's whole history.
        sa.Index("ix_sessions_node_ready_at", "node", "ready_at"),
        sa.Index("ix_sessions_node_postrun_started_at", "node", "postrun_started_at"),
    )

    id: Mapped[uuid.UUID] = _uuid()
    batch_id: Mapped[uuid.UUID] = mapped_column(sa.ForeignKey("batches.id", ondelete="CASCADE"), nullable=False)
    task_pk: Mapped[uuid.UUID] = mapped_column(sa.ForeignKey("tasks.id", ondelete="CASCADE"), nullable=False)
    task_id: Mapped[str] = mapped_column(sa.Text(), nullable=False)
    # The task's position in its batch, copied at submission so a batch's sessions page from one index.
    task_position: Mapped[int] = mapped_column(sa.Integer(), nullable=False, default=0, server_default="0")
    # Admission takes higher first (polar.lifecycle.admission): its task's ``priority``.
    priority: Mapped[int] = mapped_column(sa.SmallInteger(), nullable=False, default=50, server_default="50")
    sample_index: Mapped[int] = mapped_column(sa.Integer(), nullable=False)
    attempt: Mapped[int] = mapped_column(sa.Integer(), nullable=False, default=1, server_default="1")
    state: Mapped[str] = mapped_column(sa.Text(), nullable=False, default="pending")
    outcome: Mapped[str | None] = mapped_column(sa.Text())
    # Set when the attempt ends: "task" (training signal) or "infrastructure" (retried or out of attempts).
    outcome_class: Mapped[str | None] = mapped_column(sa.Text())
    retry_of: Mapped[uuid.UUID | None] = mapped_column(sa.ForeignKey("sessions.id", ondelete="SET NULL"))
    retried_as: Mapped[uuid.UUID | None] = mapped_column(sa.ForeignKey("sessions.id", ondelete="SET NULL"))
    reward: Mapped[float | None] = mapped_column(sa.Float())
    exit_code: Mapped[int | None] = mapped_column(sa.Integer())
    error: Mapped[str | None] = mapped_column(sa.Text())
    evaluation: Mapped[dict[str, Any] | None] = mapped_column(json_document())
    # sha256 of the proxy key: the key itself is a secret that only the harness holds.
    proxy_key_hash: Mapped[str | None] = mapped_column(sa.Text(), unique=True)
    runtime_handle: Mapped[dict[str, Any] | None] = mapped_column(json_document())
    # The clean runtime an evaluator asked for (``polar.evaluators.base``), prepared in init, removed in postrun.
    evaluator_runtime_handle: Mapped[dict[str, Any] | None] = mapped_column(json_document())
    node: Mapped[str | None] = mapped_column(sa.Text())
    worker: Mapped[str | None] = mapped_column(sa.Text())
    # The token of the stage attempt holding the session (polar.stages.lease): every transition it makes checks it.
    lease: Mapped[uuid.UUID | None] = mapped_column(sa.Uuid())
    heartbeat_at: Mapped[datetime | None] = mapped_column(sa.DateTime(timezone=True))
    # The outbox (polar.lifecycle.outbox): the stage message due, the node whose queue takes it (None: shared),
    # when it became due (same transaction as the state change), and when it was sent.
    due_stage: Mapped[str | None] = mapped_column(sa.Text())
    due_node: Mapped[str | None] = mapped_column(sa.Text())
    due_at: Mapped[datetime | None] = mapped_column(sa.DateTime(timezone=True))
    stage_enqueued_at: Mapped[datetime | None] = mapped_column(sa.DateTime(timezone=True))
    postrun_claims: Mapped[int] = mapped_column(sa.Integer(), nullable=False, default=0, server_default="0")
    deadline_at: Mapped[datetime | None] = mapped_column(sa.DateTime(timezone=True))
    # When the current weight-sync pause first refused or held one of its calls (polar.lifecycle.budget).
    pause_held_at: Mapped[datetime | None] = mapped_column(sa.DateTime(timezone=True))
    # When the harness's budget started (after the wait for an engine): a pause's credit never reaches before it.
    budget_started_at: Mapped[datetime | None] = mapped_column(sa.DateTime(timezone=True))
    num_calls: Mapped[int] = mapped_column(sa.Integer(), nullable=False, default=0, server_default="0")
    # Position in the trainers' feed: assigned when the session ends, in commit order (see polar.training.feed).
    feed_seq: Mapped[int | None] = mapped_column(sa.BigInteger(), unique=True)
    created_at: Mapped[datetime] = _created()
    init_started_at: Mapped[datetime | None] = mapped_column(sa.DateTime(timezone=True))
    ready_at: Mapped[datetime | None] = mapped_column(sa.DateTime(timezone=True))
    run_started_at: Mapped[datetime | None] = mapped_column(sa.DateTime(timezone=True))
    run_finished_at: Mapped[datetime | None] = mapped_column(sa.DateTime(timezone=True))
    postrun_started_at: Mapped[datetime | None] = mapped_column(sa.DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(sa.DateTime(timezone=True))


def _full_prompt_len(context: Any) -> int:
    """A row inserted without ``prompt_len`` (tests, tools) is as long as its prefix plus its stored tokens."""
    values = context.get_current_parameters()
    return int(values.get("prompt_prefix_len") or 0) + len(values.get("prompt_token_ids") or [])


# Admission's order over the pending sessions alone (polar.lifecycle.admission.ADMISSION_ORDER; audit G14).
_partial_index("ix_sessions_pending_admission", Session.priority.desc(), Session.attempt.desc(), Session.created_at,
               Session.batch_id, Session.task_position, Session.sample_index, where="state = 'pending'")  # fmt: skip


class ModelCall(Base):
    """A captured call. ``prompt_token_ids`` holds only the tokens after ``prompt_prefix_len``: the leading
    ones are ``prompt_parent_id``'s full prompt + completion (see ``polar.storage.prompts``); with no parent it
    is the full prompt. ``chain_hash`` is the sha256 of this call's full prompt + completion. The payloads are
    likewise deltas when ``payload_parent_id`` is set: read them through ``polar.storage.payloads``."""

    __tablename__ = "model_calls"
    __table_args__ = (
        sa.UniqueConstraint("session_id", "seq"),
        sa.Index("ix_model_calls_prompt_parent_id", "prompt_parent_id"),
        sa.Index("ix_model_calls_payload_parent_id", "payload_parent_id"),
        _partial_index("ix_model_calls_spans_policy_update", "session_id", where="spans_policy_update"),
        _partial_index("ix_model_calls_routed_experts", "session_id", where="routed_experts IS NOT NULL"),
        _partial_index("ix_model_calls_media", "session_id", where="media IS NOT NULL"),
    )

    id: Mapped[uuid.UUID] = _uuid()
    session_id: Mapped[uuid.UUID] = mapped_column(sa.ForeignKey("sessions.id", ondelete="CASCADE"), nullable=False)
    seq: Mapped[int] = mapped_column(sa.Integer(), nullable=False)
    agent: Mapped[str | None] = mapped_column(sa.Text())
    provider: Mapped[str] = mapped_column(sa.Text(), nullable=False)
    model: Mapped[str | None] = mapped_column(sa.Text())
    stream: Mapped[bool] = mapped_column(sa.Boolean(), nullable=False, default=False)
    prompt_token_ids: Mapped[list[int]] = mapped_column(int_array(), nullable=False)
    completion_token_ids: Mapped[list[int]] = mapped_column(int_array(), nullable=False)
    logprobs: Mapped[list[float]] = mapped_column(real_array(), nullable=False)
    finish_reason: Mapped[str | None] = mapped_column(sa.Text())
    status_code: Mapped[int] = mapped_column(sa.Integer(), nullable=False)
    latency_ms: Mapped[float] = mapped_column(sa.Float(), nullable=False)
    engine_latency_ms: Mapped[float | None] = mapped_column(sa.Float())
    engine_url: Mapped[str | None] = mapped_column(sa.Text())
    policy_version: Mapped[str | None] = mapped_column(sa.Text())
    request: Mapped[dict[str, Any]] = mapped_column(verbatim_json(), nullable=False)
    normalized_request: Mapped[dict[str, Any]] = mapped_column(verbatim_json(), nullable=False)
    response: Mapped[dict[str, Any]] = mapped_column(verbatim_json(), nullable=False)
    created_at: Mapped[datetime] = _created()
    prompt_parent_id: Mapped[uuid.UUID | None] = mapped_column(sa.ForeignKey("model_calls.id"))
    prompt_prefix_len: Mapped[int] = mapped_column(sa.Integer(), nullable=False, default=0, server_default="0")
    prompt_len: Mapped[int] = mapped_column(sa.Integer(), nullable=False, default=_full_prompt_len)
    chain_hash: Mapped[str | None] = mapped_column(sa.Text())
    # vLLM's per-token expert routing of the call (.npy bytes; mixture-of-experts models only): migration 0014.
    routed_experts: Mapped[bytes | None] = mapped_column(sa.LargeBinary())
    # Its images in prompt order (polar.storage.media): sha256, media_type, message_index, source, and the span
    # (offset, length) of each in the expanded prompt ids. NULL without images (and before migration 0023).
    media: Mapped[list[dict[str, Any]] | None] = mapped_column(json_document())
    # Set: request, normalized_request and response are deltas on this call's (polar.storage.payloads), which
    # payload_index (hashes of this call's own payloads) lets a later call diff against without reading them.
    payload_parent_id: Mapped[uuid.UUID | None] = mapped_column(sa.ForeignKey("model_calls.id"))
    payload_index: Mapped[dict[str, Any] | None] = mapped_column(sa.JSON())
    # False when the answer never reached the harness (captured first, then the client was gone); such calls are
    # kept for audit and left out of trajectories.
    delivered: Mapped[bool] = mapped_column(sa.Boolean(), nullable=False, server_default=sa.true())
    # What the harness asked of sampling and what the engine was sent (polar.proxy.sampling): migration 0015.
    sampling: Mapped[dict[str, Any] | None] = mapped_column(sa.JSON())
    # True: Polar wrote this answer, not the engine (over_budget: stop, polar.proxy.budget); no model tokens, never
    # in a trajectory.
    synthesized: Mapped[bool] = mapped_column(sa.Boolean(), nullable=False, server_default=sa.false())
    # The policy version when the answer was recorded; ``spans_policy_update``: it differs from ``policy_version``
    # (the call was held across a weight update, so its sampled tokens came from two policies).
    policy_version_end: Mapped[str | None] = mapped_column(sa.Text())
    spans_policy_update: Mapped[bool] = mapped_column(
        sa.Boolean(), nullable=False, default=False, server_default=sa.false()
    )
    # The protocol of the engine that served the call: vllm | sglang (polar.fleet.engines).
    engine_kind: Mapped[str | None] = mapped_column(sa.Text())
    # For a call the engine failed, why: unreachable | engine_error | engine_timeout | generation_timeout (still
    # generating on a healthy engine at the engine timeout: the policy's doing, polar.lifecycle.attempts).
    failure_kind: Mapped[str | None] = mapped_column(sa.Text())


class Trajectory(Base):
    __tablename__ = "trajectories"
    __table_args__ = (sa.Index("ix_trajectories_session_id", "session_id"),)

    id: Mapped[uuid.UUID] = _uuid()
    session_id: Mapped[uuid.UUID] = mapped_column(sa.ForeignKey("sessions.id", ondelete="CASCADE"), nullable=False)
    position: Mapped[int] = mapped_column(sa.Integer(), nullable=False)
    agent: Mapped[str | None] = mapped_column(sa.Text())
    reconstruction: Mapped[str] = mapped_column(sa.Text(), nullable=False)
    token_ids: Mapped[list[int]] = mapped_column(int_array(), nullable=False)
    loss_mask: Mapped[list[int]] = mapped_column(small_int_array(), nullable=False)
    logprobs: Mapped[list[float]] = mapped_column(real_array(), nullable=False)
    call_ids: Mapped[list[str]] = mapped_column(text_array(), nullable=False)
    reward: Mapped[float | None] = mapped_column(sa.Float())
    stats: Mapped[dict[str, Any]] = mapped_column(json_document(), nullable=False, default=dict)
    # The session's main chain (its first call's agent and what continues it), not a side call.
    main: Mapped[bool] = mapped_column(sa.Boolean(), nullable=False, default=True, server_default=sa.true())
    # Its segment of the rollout (polar.reconstruction.segments): index, edge, parent, call_id, tool_call_id,
    # evidence, trainable. NULL for rows stored before migration 0022.
    segment: Mapped[dict[str, Any] | None] = mapped_column(json_document())
    # Its images' spans, offsets into token_ids (polar.reconstruction.prefix_merging): sha256, call_id, offset,
    # length, media_type. NULL without images (and before migration 0023).
    media: Mapped[list[dict[str, Any]] | None] = mapped_column(json_document())
    created_at: Mapped[datetime] = _created()
    # The row's part of its feed item as JSON text, written by a trigger on Postgres (migration 0019; the feed reads
    # it), NULL on SQLite and for rows stored before it. Not loaded with the row.
    feed_json: Mapped[str | None] = mapped_column(sa.Text(), deferred=True)


class MediaObject(Base):
    """An image's bytes, stored once per deployment under their sha256 (``polar.storage.media`` owns the table)."""

    __tablename__ = "media_objects"

    sha256: Mapped[str] = mapped_column(sa.Text(), primary_key=True)
    media_type: Mapped[str] = mapped_column(sa.Text(), nullable=False)
    size: Mapped[int] = mapped_column(sa.Integer(), nullable=False)
    width: Mapped[int | None] = mapped_column(sa.Integer())
    height: Mapped[int | None] = mapped_column(sa.Integer())
    data: Mapped[bytes] = mapped_column(sa.LargeBinary(), nullable=False)
    created_at: Mapped[datetime] = _created()


class SessionEvent(Base):
    __tablename__ = "session_events"
    __table_args__ = (sa.Index("ix_session_events_session_id_id", "session_id", "id"),)

    id: Mapped[int] = mapped_column(sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True)
    session_id: Mapped[uuid.UUID] = mapped_column(sa.ForeignKey("sessions.id", ondelete="CASCADE"), nullable=False)
    from_state: Mapped[str | None] = mapped_column(sa.Text())
    to_state: Mapped[str] = mapped_column(sa.Text(), nullable=False)
    at: Mapped[datetime] = mapped_column(sa.DateTime(timezone=True), nullable=False)
    worker: Mapped[str | None] = mapped_column(sa.Text())
    # The node (``POLAR_NODE``) of the process that made the change.
    node: Mapped[str] = mapped_column(sa.Text(), nullable=False)
    detail: Mapped[str | None] = mapped_column(sa.Text())


class Node(Base):
    """A worker node: its READY bound and run slots, and when one of its workers last said it was alive
    (the database's clock). See ``polar.lifecycle.nodes``."""

    __tablename__ = "nodes"

    name: Mapped[str] = mapped_column(sa.Text(), primary_key=True)
    ready_buffer: Mapped[int] = mapped_column(sa.Integer(), nullable=False)
    run_slots: Mapped[int] = mapped_column(sa.Integer(), nullable=False)
    started_at: Mapped[datetime] = _created()
    seen_at: Mapped[datetime] = mapped_column(sa.DateTime(timezone=True), nullable=False)
    # ``polar node drain``: no new work here; what runs finishes (polar.lifecycle.nodes).
    drained_at: Mapped[datetime | None] = mapped_column(sa.DateTime(timezone=True))


class CallbackEvent(Base):
    """A POST owed to a batch's ``callback_url`` (polar.training.callbacks), delivered with a bounded retry."""

    __tablename__ = "callback_events"
    __table_args__ = (
        _partial_index(
            "ix_callback_events_pending", "next_attempt_at", where="delivered_at IS NULL AND failed_at IS NULL"
        ),
        sa.Index("ix_callback_events_batch_id", "batch_id"),
    )

    id: Mapped[int] = mapped_column(sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True)
    batch_id: Mapped[uuid.UUID] = mapped_column(sa.ForeignKey("batches.id", ondelete="CASCADE"), nullable=False)
    url: Mapped[str] = mapped_column(sa.Text(), nullable=False)
    payload: Mapped[dict[str, Any]] = mapped_column(json_document(), nullable=False)
    created_at: Mapped[datetime] = _created()
    next_attempt_at: Mapped[datetime] = mapped_column(
        sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
    )
    attempts: Mapped[int] = mapped_column(sa.Integer(), nullable=False, default=0, server_default="0")
    delivered_at: Mapped[datetime | None] = mapped_column(sa.DateTime(timezone=True))
    failed_at: Mapped[datetime | None] = mapped_column(sa.DateTime(timezone=True))
    last_error: Mapped[str | None] = mapped_column(sa.Text())


class AuditEvent(Base):
    """Who did what through the API: submitted, cancelled, paused, resumed, exported (polar.records.audit)."""

    __tablename__ = "audit_log"
    __table_args__ = (sa.Index("ix_audit_log_at", "at"),)

    id: Mapped[int] = mapped_column(sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True)
    at: Mapped[datetime] = _created()
    # The token's role and a fingerprint of it (never the token): ``admin:1f2e3d4c``.
    actor: Mapped[str] = mapped_column(sa.Text(), nullable=False)
    action: Mapped[str] = mapped_column(sa.Text(), nullable=False)
    # What it acted on: a batch id, an export's format, the engine.
    target: Mapped[str | None] = mapped_column(sa.Text())
    remote_addr: Mapped[str | None] = mapped_column(sa.Text())
    detail: Mapped[dict[str, Any]] = mapped_column(json_document(), nullable=False, default=dict)


class EngineControl(Base):
    """One row: whether model calls are held (a trainer syncing weights) and the policy version they carry."""

    __tablename__ = "engine_control"

    id: Mapped[int] = mapped_column(sa.Integer(), primary_key=True)
    paused: Mapped[bool] = mapped_column(sa.Boolean(), nullable=False, default=False)
    mode: Mapped[str] = mapped_column(sa.Text(), nullable=False, default="reject")  # reject (429) | wait
    policy_version: Mapped[str | None] = mapped_column(sa.Text())
    updated_at: Mapped[datetime] = mapped_column(sa.DateTime(timezone=True), nullable=False)
    paused_at: Mapped[datetime | None] = mapped_column(sa.DateTime(timezone=True))  # when the current pause began


class CallRefusal(Base):
    """How many of a session's model calls the proxy refused before the engine saw them, per reason
    (``polar.proxy.refusals``)."""

    __tablename__ = "call_refusals"

    session_id: Mapped[uuid.UUID] = mapped_column(sa.ForeignKey("sessions.id", ondelete="CASCADE"), primary_key=True)
    reason: Mapped[str] = mapped_column(sa.Text(), primary_key=True)
    count: Mapped[int] = mapped_column(sa.Integer(), nullable=False)
    first_at: Mapped[datetime] = _created()
    last_at: Mapped[datetime] = _created()


class EngineRecord(Base):
    """An engine added at run time (``POST /v1/engines``), beside ``POLAR_ENGINE_URLS``; ``drained_at``: no new
    sessions go to it (polar.fleet.overview)."""

    __tablename__ = "engines"

    url: Mapped[str] = mapped_column(sa.Text(), primary_key=True)
    kind: Mapped[str] = mapped_column(sa.Text(), nullable=False)
    added_at: Mapped[datetime] = _created()
    added_by: Mapped[str | None] = mapped_column(sa.Text())
    drained_at: Mapped[datetime | None] = mapped_column(sa.DateTime(timezone=True))
