"""add the stage outbox, lease tokens, postrun claims and the callback outbox

``due_stage`` / ``due_node`` / ``due_at`` record, in the same transaction as the state change, which stage
message a session is due (and on which node's queue); ``stage_enqueued_at`` is set once it was sent, so the
reconciler sends whatever is due and unsent after a broker failure. ``lease`` is the token of the stage attempt
that holds the session (every transition by the holder checks it). ``postrun_claims`` counts postrun's claims so
one that crashes every time is ended. ``callback_events`` holds the POSTs to batches' ``callback_url``, delivered
off the critical path with a bounded retry (``batches.callback_sent_at``, which the reconciler retried by, goes).

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.add_column(sa.Column("due_stage", sa.Text(), nullable=True))
        batch.add_column(sa.Column("due_node", sa.Text(), nullable=True))
        batch.add_column(sa.Column("due_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("lease", sa.Uuid(), nullable=True))
        batch.add_column(sa.Column("postrun_claims", sa.Integer(), server_default="0", nullable=False))
    # The reconciler's outbox query: due and unsent.
    op.create_index(
        "ix_sessions_due_unsent",
        "sessions",
        ["due_at"],
        postgresql_where=sa.text("due_stage IS NOT NULL AND stage_enqueued_at IS NULL"),
        sqlite_where=sa.text("due_stage IS NOT NULL AND stage_enqueued_at IS NULL"),
    )
    op.create_table(
        "callback_events",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("batch_id", sa.Uuid(), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column(
            "payload", sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"), nullable=False
        ),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("delivered_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("failed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["batch_id"], ["batches.id"], name=op.f("fk_callback_events_batch_id_batches"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_callback_events")),
    )
    op.create_index(
        "ix_callback_events_pending",
        "callback_events",
        ["next_attempt_at"],
        postgresql_where=sa.text("delivered_at IS NULL AND failed_at IS NULL"),
        sqlite_where=sa.text("delivered_at IS NULL AND failed_at IS NULL"),
    )
    op.create_index("ix_callback_events_batch_id", "callback_events", ["batch_id"])
    with op.batch_alter_table("batches") as batch:
        batch.drop_column("callback_sent_at")


def downgrade() -> None:
    with op.batch_alter_table("batches") as batch:
        batch.add_column(sa.Column("callback_sent_at", sa.DateTime(timezone=True), nullable=True))
    op.drop_index("ix_callback_events_batch_id", table_name="callback_events")
    op.drop_index("ix_callback_events_pending", table_name="callback_events")
    op.drop_table("callback_events")
    op.drop_index("ix_sessions_due_unsent", table_name="sessions")
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("postrun_claims")
        batch.drop_column("lease")
        batch.drop_column("due_at")
        batch.drop_column("due_node")
        batch.drop_column("due_stage")
