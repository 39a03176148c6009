"""add attempts per sample, the node of every session event, and the node registry

A sample (task, ``sample_index``) may now take several sessions, one per attempt: ``attempt`` counts them,
``retry_of`` / ``retried_as`` link an attempt lost to the infrastructure with the next one, and
``outcome_class`` says whether an ended attempt is training signal (``task``) or not (``infrastructure``).
Every ``session_events`` row records the node that made it. ``nodes`` holds each worker node's READY bound and
run slots and when a worker of it was last seen, so admission sizes the buffer by the live nodes and the
reconciler can tell a lost node.

The reward views count only task outcomes; ``lost_attempts`` lists the attempts the infrastructure lost.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

TERMINAL = "('completed', 'failed', 'timed_out', 'cancelled')"

# Each sample counts once, by its latest attempt (``retried_as IS NULL``); rewards only from task outcomes.
VIEWS = {
    "task_rewards": f"""
        SELECT s.batch_id, s.task_id, count(*) AS sessions,
               count(*) FILTER (WHERE s.state IN {TERMINAL}) AS finished,
               count(*) FILTER (WHERE s.state = 'completed') AS completed,
               avg(s.reward) FILTER (WHERE s.outcome_class = 'task') AS mean_reward,
               min(s.reward) FILTER (WHERE s.outcome_class = 'task') AS min_reward,
               max(s.reward) FILTER (WHERE s.outcome_class = 'task') AS max_reward,
               stddev_samp(s.reward) FILTER (WHERE s.outcome_class = 'task') AS reward_stddev,
               count(*) FILTER (WHERE s.outcome_class = 'infrastructure') AS out_of_attempts
        FROM sessions s WHERE s.retried_as IS NULL GROUP BY s.batch_id, s.task_id""",
    "batch_rewards": f"""
        SELECT b.id AS batch_id, b.name, b.created_at, b.finished_at, count(s.id) AS sessions,
               count(s.id) FILTER (WHERE s.state IN {TERMINAL}) AS finished,
               count(s.id) FILTER (WHERE s.state = 'completed') AS completed,
               count(s.id) FILTER (WHERE s.state = 'failed' AND s.outcome_class = 'task') AS failed,
               count(s.id) FILTER (WHERE s.state = 'timed_out') AS timed_out,
               avg(s.reward) FILTER (WHERE s.outcome_class = 'task') AS mean_reward,
               count(s.id) FILTER (WHERE s.outcome_class = 'infrastructure') AS out_of_attempts,
               (SELECT count(*) FROM sessions r WHERE r.batch_id = b.id AND r.retried_as IS NOT NULL)
                   AS lost_attempts
        FROM batches b LEFT JOIN sessions s ON s.batch_id = b.id AND s.retried_as IS NULL GROUP BY b.id""",
    "lost_attempts": """
        SELECT s.id AS session_id, s.batch_id, s.task_id, s.sample_index, s.attempt, s.outcome, s.error,
               s.node, s.num_calls, s.finished_at, s.retried_as
        FROM sessions s WHERE s.outcome_class = 'infrastructure'""",
}

# The views as 0003 created them, for downgrade.
OLD_VIEWS = {
    "task_rewards": f"""
        SELECT s.batch_id, s.task_id, count(*) AS sessions,
               count(*) FILTER (WHERE s.state IN {TERMINAL}) AS finished,
               count(*) FILTER (WHERE s.state = 'completed') AS completed,
               avg(s.reward) AS mean_reward, min(s.reward) AS min_reward, max(s.reward) AS max_reward,
               stddev_samp(s.reward) AS reward_stddev
        FROM sessions s GROUP BY s.batch_id, s.task_id""",
    "batch_rewards": f"""
        SELECT b.id AS batch_id, b.name, b.created_at, b.finished_at, count(s.id) AS sessions,
               count(s.id) FILTER (WHERE s.state IN {TERMINAL}) AS finished,
               count(s.id) FILTER (WHERE s.state = 'completed') AS completed,
               count(s.id) FILTER (WHERE s.state = 'failed') AS failed,
               count(s.id) FILTER (WHERE s.state = 'timed_out') AS timed_out,
               avg(s.reward) AS mean_reward
        FROM batches b LEFT JOIN sessions s ON s.batch_id = b.id GROUP BY b.id""",
}


def upgrade() -> None:
    postgres = op.get_bind().dialect.name == "postgresql"
    if postgres:
        for name in ("task_rewards", "batch_rewards"):
            op.execute(f"DROP VIEW IF EXISTS {name}")
    with op.batch_alter_table("sessions") as batch:
        batch.add_column(sa.Column("attempt", sa.Integer(), server_default="1", nullable=False))
        batch.add_column(sa.Column("outcome_class", sa.Text(), nullable=True))
        batch.add_column(sa.Column("retry_of", sa.Uuid(), nullable=True))
        batch.add_column(sa.Column("retried_as", sa.Uuid(), nullable=True))
        batch.drop_constraint("uq_sessions_task_pk_sample_index", type_="unique")
        batch.create_unique_constraint(
            "uq_sessions_task_pk_sample_index_attempt", ["task_pk", "sample_index", "attempt"]
        )
        batch.create_foreign_key("fk_sessions_retry_of_sessions", "sessions", ["retry_of"], ["id"], ondelete="SET NULL")
        batch.create_foreign_key(
            "fk_sessions_retried_as_sessions", "sessions", ["retried_as"], ["id"], ondelete="SET NULL"
        )
    # Every attempt that ended before attempts existed was treated as training signal.
    op.execute(f"UPDATE sessions SET outcome_class = 'task' WHERE state IN {TERMINAL}")
    with op.batch_alter_table("session_events") as batch:
        batch.add_column(sa.Column("node", sa.Text(), nullable=True))
    op.execute(
        "UPDATE session_events SET node = coalesce("
        "(SELECT s.node FROM sessions s WHERE s.id = session_events.session_id), 'unknown')"
    )
    with op.batch_alter_table("session_events") as batch:
        batch.alter_column("node", existing_type=sa.Text(), nullable=False)
    op.create_table(
        "nodes",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("ready_buffer", sa.Integer(), nullable=False),
        sa.Column("run_slots", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_nodes")),
    )
    if postgres:
        for name, query in VIEWS.items():
            op.execute(f"CREATE VIEW {name} AS {query}")


def downgrade() -> None:
    postgres = op.get_bind().dialect.name == "postgresql"
    if postgres:
        for name in VIEWS:
            op.execute(f"DROP VIEW IF EXISTS {name}")
    op.drop_table("nodes")
    with op.batch_alter_table("session_events") as batch:
        batch.drop_column("node")
    op.execute("DELETE FROM sessions WHERE attempt > 1")
    with op.batch_alter_table("sessions") as batch:
        batch.drop_constraint("fk_sessions_retried_as_sessions", type_="foreignkey")
        batch.drop_constraint("fk_sessions_retry_of_sessions", type_="foreignkey")
        batch.drop_constraint("uq_sessions_task_pk_sample_index_attempt", type_="unique")
        batch.create_unique_constraint("uq_sessions_task_pk_sample_index", ["task_pk", "sample_index"])
        batch.drop_column("retried_as")
        batch.drop_column("retry_of")
        batch.drop_column("outcome_class")
        batch.drop_column("attempt")
    if postgres:
        for name, query in OLD_VIEWS.items():
            op.execute(f"CREATE VIEW {name} AS {query}")
