"""add the expert routing an engine reports per call

``model_calls.routed_experts`` holds vLLM's per-token expert routing of a call (``routed_experts`` of its answer,
vLLM ≥ 0.3x with ``--enable-return-routed-experts``, for mixture-of-experts models): the ``.npy`` bytes of an array
of shape (prompt + completion tokens - 1, layers, experts per token), which routing-replay (R3) training needs.
Stored once, as bytes, instead of as base64 text inside the stored answer. Null for dense models and engines that
do not report it.

Revision ID: 0014
Revises: 0013
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("model_calls") as batch:
        batch.add_column(sa.Column("routed_experts", sa.LargeBinary(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("model_calls") as batch:
        batch.drop_column("routed_experts")
