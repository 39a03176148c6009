"""record each call's sampling parameters, and mark answers Polar made up itself

``model_calls.sampling`` holds the sampling parameters of a call: ``{"requested": {...}, "used": {...}}``, what the
harness asked for (temperature, top_p, top_k, min_p, the penalties, seed, max tokens, as present) and what the
engine was sent after ``POLAR_SAMPLING_OVERRIDES`` and the task's ``sampling: neutralize``. Null for calls stored
before it.

``model_calls.synthesized`` is true for an answer Polar wrote instead of the engine: the final stop reply to a call
over the task's ``max_calls`` under ``over_budget: stop``. It holds no model tokens and is never in a trajectory.

Revision ID: 0015
Revises: 0014
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("model_calls") as batch:
        batch.add_column(sa.Column("sampling", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("synthesized", sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table("model_calls") as batch:
        batch.drop_column("synthesized")
        batch.drop_column("sampling")
