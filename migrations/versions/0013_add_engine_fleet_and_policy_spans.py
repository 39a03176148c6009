"""add the engine fleet and the policy versions a call spanned

``model_calls.policy_version_end`` is the policy version when the call's answer was recorded (``policy_version`` is
the one it started under); ``spans_policy_update`` is true when they differ, i.e. an engine held the call across a
weight update (``POST /v1/engine/pause`` in ``keep`` mode) and its sampled tokens came from two policies.
``engine_kind`` is the protocol of the engine that served the call (``vllm`` | ``sglang``), beside ``engine_url``.

``engines`` lists the engines added at run time (``POST /v1/engines``), beside ``POLAR_ENGINE_URLS``; a drained one
keeps its row with ``drained_at`` set and gets no new sessions.

Revision ID: 0013
Revises: 0012
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("model_calls") as batch:
        batch.add_column(sa.Column("policy_version_end", sa.Text(), nullable=True))
        batch.add_column(sa.Column("spans_policy_update", sa.Boolean(), server_default=sa.false(), nullable=False))
        batch.add_column(sa.Column("engine_kind", sa.Text(), nullable=True))
    op.execute("UPDATE model_calls SET policy_version_end = policy_version")
    op.create_index(
        "ix_model_calls_spans_policy_update",
        "model_calls",
        ["session_id"],
        postgresql_where=sa.text("spans_policy_update"),
        sqlite_where=sa.text("spans_policy_update"),
    )
    op.create_table(
        "engines",
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("added_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("added_by", sa.Text(), nullable=True),
        sa.Column("drained_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("url", name=op.f("pk_engines")),
    )


def downgrade() -> None:
    op.drop_table("engines")
    op.drop_index("ix_model_calls_spans_policy_update", table_name="model_calls")
    with op.batch_alter_table("model_calls") as batch:
        batch.drop_column("engine_kind")
        batch.drop_column("spans_policy_update")
        batch.drop_column("policy_version_end")
