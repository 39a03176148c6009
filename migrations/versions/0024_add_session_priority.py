"""add each session's ``priority``, a batch's circuit breaker, and indexes that keep admission and the reconciler
off the history

``sessions.priority`` (0-100, default 50): its task's; admission takes higher first (``polar.lifecycle.admission``).
``batches.max_consecutive_infra_losses``, ``infra_loss_streak``, ``halted_at``, ``halted_reason``: the batch's
circuit breaker (``polar.stages.circuit_breaker``). ``nodes.drained_at``: ``polar node drain`` (no new work there).
``tasks.stopped_at``: the group stopped early (``early_stop``, ``polar.stages.early_stop``). ``session_time``: where
each session's time went.
``ix_sessions_pending_admission``: admission's whole order over the pending sessions alone, so a pass reads the rows
it admits instead of sorting every pending session (audit G14). ``ix_sessions_runtime_held`` and
``ix_sessions_node_ready_at`` / ``_postrun_started_at``: the reconciler's sweep of sessions still holding runtimes
and its lost-message checks' lookups of a node's later sessions, which scanned every session ever stored (audit
G15).

Revision ID: 0024
Revises: 0023
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None

INDEXES = (
    ("ix_sessions_pending_admission",
     [sa.text("priority DESC"), sa.text("attempt DESC"), "created_at", "batch_id", "task_position", "sample_index"],
     "state = 'pending'"),
    ("ix_sessions_runtime_held", ["state"], "runtime_handle IS NOT NULL OR evaluator_runtime_handle IS NOT NULL"),
)  # fmt: skip
# A node's sessions by when they became ready or reached postrun: the lost-message checks' "overtaken" lookups.
NODE_INDEXES = (("ix_sessions_node_ready_at", ["node", "ready_at"]),
                ("ix_sessions_node_postrun_started_at", ["node", "postrun_started_at"]))  # fmt: skip


# Where each session's time went, as ``GET /v1/sessions/<id>``'s ``time`` (polar.storage.serialization.time_record).
SESSION_TIME = """CREATE VIEW session_time AS
    SELECT s.id AS session_id, s.batch_id, s.task_id, s.sample_index, s.attempt, s.state,
           extract(epoch FROM s.init_started_at - s.created_at) AS queued_s,
           extract(epoch FROM s.ready_at - s.init_started_at) AS init_s,
           extract(epoch FROM s.run_started_at - s.ready_at) AS ready_s,
           extract(epoch FROM s.budget_started_at - s.run_started_at) AS engine_gate_s,
           extract(epoch FROM s.run_finished_at - s.budget_started_at) AS harness_s,
           c.model_calls_s,
           greatest(0, extract(epoch FROM s.run_finished_at - s.budget_started_at) - c.model_calls_s)
               AS between_calls_s,
           greatest(0, extract(epoch FROM s.deadline_at - s.budget_started_at)
                       - (t.spec ->> 'timeout_seconds')::float) AS paused_s,
           extract(epoch FROM s.finished_at - s.postrun_started_at) AS postrun_s,
           extract(epoch FROM s.finished_at - s.created_at) AS total_s
    FROM sessions s JOIN tasks t ON t.id = s.task_pk
    LEFT JOIN LATERAL (
        SELECT coalesce(sum(m.latency_ms), 0) / 1000 AS model_calls_s FROM model_calls m
        WHERE m.session_id = s.id AND m.status_code = 200 AND m.delivered AND NOT m.synthesized
    ) c ON true"""


def _breaker() -> tuple[sa.Column[object], ...]:
    return (
        sa.Column("max_consecutive_infra_losses", sa.Integer(), nullable=True),
        sa.Column("infra_loss_streak", sa.Integer(), server_default="0", nullable=False),
        sa.Column("halted_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("halted_reason", sa.Text(), nullable=True),
    )


def upgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.add_column(sa.Column("priority", sa.SmallInteger(), server_default="50", nullable=False))
    with op.batch_alter_table("batches") as batch:
        for column in _breaker():
            batch.add_column(column)
    with op.batch_alter_table("nodes") as batch:
        batch.add_column(sa.Column("drained_at", sa.DateTime(timezone=True), nullable=True))
    with op.batch_alter_table("tasks") as batch:
        batch.add_column(sa.Column("stopped_at", sa.DateTime(timezone=True), nullable=True))
    for name, columns, where in INDEXES:
        op.create_index(name, "sessions", columns, postgresql_where=sa.text(where), sqlite_where=sa.text(where))
    for name, columns in NODE_INDEXES:
        op.create_index(name, "sessions", columns)
    if op.get_bind().dialect.name == "postgresql":
        op.execute(SESSION_TIME)


def downgrade() -> None:
    # Plain DROP COLUMN (SQLite 3.35+ has it): a batch-mode copy of ``batches`` or ``sessions`` would break the
    # views SQLite keeps over them (``audit_trail``).
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP VIEW session_time")
    for name, *_ in (*INDEXES, *NODE_INDEXES):
        op.drop_index(name, table_name="sessions")
    op.drop_column("tasks", "stopped_at")
    op.drop_column("nodes", "drained_at")
    for column in _breaker():
        op.drop_column("batches", column.name)
    op.drop_column("sessions", "priority")
