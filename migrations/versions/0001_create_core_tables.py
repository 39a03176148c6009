"""create core tables

Revision ID: 0001
Revises: (none)
Create Date: 2026-11-21 05:21:20.264706
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "batches",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("name", sa.Text(), nullable=True),
        sa.Column(
            "defaults",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("idempotency_key", sa.Text(), nullable=True),
        sa.Column("request_hash", sa.Text(), nullable=False),
        sa.Column("num_sessions", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("cancel_requested_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_batches")),
        sa.UniqueConstraint("idempotency_key", name=op.f("uq_batches_idempotency_key")),
    )
    op.create_table(
        "tasks",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("batch_id", sa.Uuid(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("task_id", sa.Text(), nullable=False),
        sa.Column("num_samples", sa.Integer(), nullable=False),
        sa.Column(
            "spec",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.ForeignKeyConstraint(
            ["batch_id"], ["batches.id"], name=op.f("fk_tasks_batch_id_batches"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tasks")),
        sa.UniqueConstraint("batch_id", "position", name=op.f("uq_tasks_batch_id_position")),
    )
    op.create_table(
        "sessions",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("batch_id", sa.Uuid(), nullable=False),
        sa.Column("task_pk", sa.Uuid(), nullable=False),
        sa.Column("task_id", sa.Text(), nullable=False),
        sa.Column("sample_index", sa.Integer(), nullable=False),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("outcome", sa.Text(), nullable=True),
        sa.Column("reward", sa.Float(), nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column(
            "evaluation",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column("proxy_key_hash", sa.Text(), nullable=True),
        sa.Column(
            "runtime_handle",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column("node", sa.Text(), nullable=True),
        sa.Column("worker", sa.Text(), nullable=True),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("stage_enqueued_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("deadline_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("num_calls", sa.Integer(), server_default="0", nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("init_started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("ready_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("run_started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("run_finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("postrun_started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["batch_id"], ["batches.id"], name=op.f("fk_sessions_batch_id_batches"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(["task_pk"], ["tasks.id"], name=op.f("fk_sessions_task_pk_tasks"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_sessions")),
        sa.UniqueConstraint("proxy_key_hash", name=op.f("uq_sessions_proxy_key_hash")),
        sa.UniqueConstraint("task_pk", "sample_index", name=op.f("uq_sessions_task_pk_sample_index")),
    )
    op.create_index("ix_sessions_batch_id", "sessions", ["batch_id"], unique=False)
    op.create_index("ix_sessions_state_created_at", "sessions", ["state", "created_at"], unique=False)
    op.create_table(
        "model_calls",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("session_id", sa.Uuid(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("agent", sa.Text(), nullable=True),
        sa.Column("provider", sa.Text(), nullable=False),
        sa.Column("model", sa.Text(), nullable=True),
        sa.Column("stream", sa.Boolean(), nullable=False),
        sa.Column(
            "prompt_token_ids",
            sa.JSON().with_variant(postgresql.ARRAY(sa.Integer()), "postgresql"),
            nullable=False,
        ),
        sa.Column(
            "completion_token_ids",
            sa.JSON().with_variant(postgresql.ARRAY(sa.Integer()), "postgresql"),
            nullable=False,
        ),
        sa.Column("logprobs", sa.JSON().with_variant(postgresql.ARRAY(sa.REAL()), "postgresql"), nullable=False),
        sa.Column("finish_reason", sa.Text(), nullable=True),
        sa.Column("status_code", sa.Integer(), nullable=False),
        sa.Column("latency_ms", sa.Float(), nullable=False),
        sa.Column("engine_latency_ms", sa.Float(), nullable=True),
        sa.Column("engine_url", sa.Text(), nullable=True),
        sa.Column("policy_version", sa.Text(), nullable=True),
        sa.Column(
            "request",
            sa.JSON().with_variant(postgresql.JSON(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column(
            "normalized_request",
            sa.JSON().with_variant(postgresql.JSON(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column(
            "response",
            sa.JSON().with_variant(postgresql.JSON(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.ForeignKeyConstraint(
            ["session_id"],
            ["sessions.id"],
            name=op.f("fk_model_calls_session_id_sessions"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_model_calls")),
        sa.UniqueConstraint("session_id", "seq", name=op.f("uq_model_calls_session_id_seq")),
    )
    op.create_table(
        "session_events",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("session_id", sa.Uuid(), nullable=False),
        sa.Column("from_state", sa.Text(), nullable=True),
        sa.Column("to_state", sa.Text(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("worker", sa.Text(), nullable=True),
        sa.Column("detail", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["session_id"],
            ["sessions.id"],
            name=op.f("fk_session_events_session_id_sessions"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_session_events")),
    )
    op.create_index("ix_session_events_session_id_id", "session_events", ["session_id", "id"], unique=False)
    op.create_table(
        "trajectories",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("session_id", sa.Uuid(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("agent", sa.Text(), nullable=True),
        sa.Column("reconstruction", sa.Text(), nullable=False),
        sa.Column("token_ids", sa.JSON().with_variant(postgresql.ARRAY(sa.Integer()), "postgresql"), nullable=False),
        sa.Column(
            "loss_mask",
            sa.JSON().with_variant(postgresql.ARRAY(sa.SmallInteger()), "postgresql"),
            nullable=False,
        ),
        sa.Column("logprobs", sa.JSON().with_variant(postgresql.ARRAY(sa.REAL()), "postgresql"), nullable=False),
        sa.Column("call_ids", sa.JSON().with_variant(postgresql.ARRAY(sa.Text()), "postgresql"), nullable=False),
        sa.Column("reward", sa.Float(), nullable=True),
        sa.Column(
            "stats",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.ForeignKeyConstraint(
            ["session_id"],
            ["sessions.id"],
            name=op.f("fk_trajectories_session_id_sessions"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_trajectories")),
    )
    op.create_index("ix_trajectories_session_id", "trajectories", ["session_id"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_trajectories_session_id", table_name="trajectories")
    op.drop_table("trajectories")
    op.drop_index("ix_session_events_session_id_id", table_name="session_events")
    op.drop_table("session_events")
    op.drop_table("model_calls")
    op.drop_index("ix_sessions_state_created_at", table_name="sessions")
    op.drop_index("ix_sessions_batch_id", table_name="sessions")
    op.drop_table("sessions")
    op.drop_table("tasks")
    op.drop_table("batches")
