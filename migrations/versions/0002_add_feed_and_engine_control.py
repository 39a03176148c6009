"""add the trainers' feed position and the engine control row

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.add_column(sa.Column("feed_seq", sa.BigInteger(), nullable=True))
        batch.create_unique_constraint(op.f("uq_sessions_feed_seq"), ["feed_seq"])
    op.create_table(
        "engine_control",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("paused", sa.Boolean(), nullable=False),
        sa.Column("mode", sa.Text(), nullable=False),
        sa.Column("policy_version", sa.Text(), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_engine_control")),
    )


def downgrade() -> None:
    op.drop_table("engine_control")
    with op.batch_alter_table("sessions") as batch:
        batch.drop_constraint(op.f("uq_sessions_feed_seq"), type_="unique")
        batch.drop_column("feed_seq")
