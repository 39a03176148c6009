"""add keyset paging of a batch's sessions and a position for each completed group

``sessions.task_position`` (its task's place in the batch, copied at submission) lets a batch's sessions be read a
page at a time in task, sample, attempt order from one index, at any depth of a 100,000-session batch.
``tasks.group_feed_seq`` is the feed position at which the task's group completed (its last sample settled), set in
the same transaction, so the groups feed is an index range scan instead of an aggregate over the batch.
``(batch_id, feed_seq)`` serves the feed of one batch among many; ``(batch_id, state)`` (covering the columns a batch's
progress reads) and the partial ``(batch_id) WHERE retry_of IS NOT NULL`` keep a batch's status and session count
index-only.

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

BACKFILL_POSITIONS = (
    "UPDATE sessions SET task_position = (SELECT position FROM tasks WHERE tasks.id = sessions.task_pk)"
)
BACKFILL_GROUPS = """
UPDATE tasks SET group_feed_seq = (
    SELECT max(s.feed_seq) FROM sessions s WHERE s.task_pk = tasks.id AND s.feed_seq IS NOT NULL
) WHERE (SELECT count(*) FROM sessions s WHERE s.task_pk = tasks.id AND s.feed_seq IS NOT NULL) = tasks.num_samples
"""


def upgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.add_column(sa.Column("task_position", sa.Integer(), server_default="0", nullable=False))
    op.execute(BACKFILL_POSITIONS)
    with op.batch_alter_table("tasks") as batch:
        batch.add_column(sa.Column("group_feed_seq", sa.BigInteger(), nullable=True))
    op.execute(BACKFILL_GROUPS)
    op.drop_index("ix_sessions_batch_id", table_name="sessions")
    op.create_index(
        "ix_sessions_batch_id_task_position",
        "sessions",
        ["batch_id", "task_position", "sample_index", "attempt"],
        unique=False,
    )
    where = sa.text("feed_seq IS NOT NULL")
    op.create_index("ix_sessions_batch_id_feed_seq", "sessions", ["batch_id", "feed_seq"],
                    postgresql_where=where, sqlite_where=where)  # fmt: skip
    op.create_index("ix_sessions_batch_id_state", "sessions", ["batch_id", "state"],
                    postgresql_include=["retried_as", "outcome_class"])  # fmt: skip
    retries = sa.text("retry_of IS NOT NULL")
    op.create_index("ix_sessions_batch_id_retries", "sessions", ["batch_id"],
                    postgresql_where=retries, sqlite_where=retries)  # fmt: skip
    groups = sa.text("group_feed_seq IS NOT NULL")
    op.create_index("ix_tasks_group_feed_seq", "tasks", ["group_feed_seq"],
                    postgresql_where=groups, sqlite_where=groups)  # fmt: skip
    op.create_index("ix_tasks_batch_id_group_feed_seq", "tasks", ["batch_id", "group_feed_seq"],
                    postgresql_where=groups, sqlite_where=groups)  # fmt: skip


def downgrade() -> None:
    op.drop_index("ix_tasks_batch_id_group_feed_seq", table_name="tasks")
    op.drop_index("ix_tasks_group_feed_seq", table_name="tasks")
    op.drop_index("ix_sessions_batch_id_retries", table_name="sessions")
    op.drop_index("ix_sessions_batch_id_state", table_name="sessions")
    op.drop_index("ix_sessions_batch_id_feed_seq", table_name="sessions")
    op.drop_index("ix_sessions_batch_id_task_position", table_name="sessions")
    op.create_index("ix_sessions_batch_id", "sessions", ["batch_id"], unique=False)
    with op.batch_alter_table("tasks") as batch:
        batch.drop_column("group_feed_seq")
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("task_position")
