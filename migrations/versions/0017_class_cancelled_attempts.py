"""class cancelled attempts as cancelled

Cancelled attempts had the class ``task``; they now have a class of their own, ``cancelled``: never scored, never
served (the feed, groups, exports and reward views serve the task class only). This moves the rows stored before,
so a database that ran the earlier code serves no cancelled attempt either. Data only; downgrade moves them back.

Revision ID: 0017
Revises: 0016
"""

from __future__ import annotations

from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("UPDATE sessions SET outcome_class = 'cancelled' WHERE outcome = 'cancelled' AND outcome_class = 'task'")


def downgrade() -> None:
    op.execute("UPDATE sessions SET outcome_class = 'task' WHERE outcome_class = 'cancelled'")
