"""add refused calls and when the engine was paused

``call_refusals`` counts, per session and reason, the model calls the proxy refused before they reached the
engine: ``paused`` (a weight-sync pause in ``reject`` mode, or ``wait`` mode out of waiters or time),
``database_outage`` (the proxy could not reach Postgres: counted in Redis meanwhile and folded in at postrun),
``max_calls`` and ``max_concurrent_calls`` (the task's own call limits). Postrun classes a harness that gave up
after refusals caused by the infrastructure as ``engine_failed``.

``engine_control.paused_at`` is when the current pause began (null while calls flow), so the paused time can be
given back to the budgets of the harnesses that were running through it.

Revision ID: 0016
Revises: 0015
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "call_refusals",
        sa.Column("session_id", sa.Uuid(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column("first_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("last_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.ForeignKeyConstraint(
            ["session_id"], ["sessions.id"], name=op.f("fk_call_refusals_session_id_sessions"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("session_id", "reason", name=op.f("pk_call_refusals")),
    )
    with op.batch_alter_table("engine_control") as batch:
        batch.add_column(sa.Column("paused_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("engine_control") as batch:
        batch.drop_column("paused_at")
    op.drop_table("call_refusals")
