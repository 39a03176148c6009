"""index the calls that carry expert routing

The feed and a session's trajectories read the expert routing of their sessions' calls. Found by each call's id, a
feed page of 1,000 sessions' trajectories probed the primary key 10,000 times, for dense models to find nothing.
This partial index holds only the calls that have routing (none for dense models), by session.

Revision ID: 0018
Revises: 0017
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

WHERE = "routed_experts IS NOT NULL"


def upgrade() -> None:
    op.create_index(
        "ix_model_calls_routed_experts",
        "model_calls",
        ["session_id"],
        postgresql_where=sa.text(WHERE),
        sqlite_where=sa.text(WHERE),
    )


def downgrade() -> None:
    op.drop_index("ix_model_calls_routed_experts", table_name="model_calls")
