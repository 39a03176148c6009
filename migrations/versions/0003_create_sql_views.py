"""create the SQL views users query (docs/sql.md)

Postgres only: they use arrays and jsonb; the embedded SQLite database has none.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

TERMINAL = "('completed', 'failed', 'timed_out', 'cancelled')"

VIEWS = {
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
    "session_tokens": """
        SELECT s.id AS session_id, s.batch_id, s.task_id, s.sample_index, s.state, s.reward,
               count(c.id) AS calls,
               coalesce(sum(cardinality(c.prompt_token_ids)), 0) AS prompt_tokens,
               coalesce(sum(cardinality(c.completion_token_ids)), 0) AS completion_tokens,
               (SELECT count(*) FROM trajectories t WHERE t.session_id = s.id) AS trajectories
        FROM sessions s LEFT JOIN model_calls c ON c.session_id = s.id AND c.status_code = 200
        GROUP BY s.id""",
    "merge_breaks": """
        SELECT s.batch_id, t.session_id, t.id AS trajectory_id, b ->> 'reason' AS reason,
               b ->> 'call_id' AS call_id, (b ->> 'seq')::int AS seq, b ->> 'agent' AS agent,
               (b ->> 'position')::int AS position, (b ->> 'expected_token')::int AS expected_token,
               (b ->> 'actual_token')::int AS actual_token
        FROM trajectories t JOIN sessions s ON s.id = t.session_id
        CROSS JOIN LATERAL jsonb_array_elements(
            CASE WHEN jsonb_typeof(t.stats -> 'breaks') = 'array' THEN t.stats -> 'breaks' ELSE '[]'::jsonb END
        ) AS b""",
    "stage_latencies": """
        SELECT s.id AS session_id, s.batch_id, s.task_id, s.state,
               extract(epoch FROM s.init_started_at - s.created_at) AS pending_s,
               extract(epoch FROM s.ready_at - s.init_started_at) AS init_s,
               extract(epoch FROM s.run_started_at - s.ready_at) AS ready_s,
               extract(epoch FROM coalesce(s.run_finished_at, s.postrun_started_at) - s.run_started_at) AS run_s,
               extract(epoch FROM s.finished_at - s.postrun_started_at) AS postrun_s,
               extract(epoch FROM s.finished_at - s.init_started_at) AS total_s
        FROM sessions s""",
}


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for name, query in VIEWS.items():
        op.execute(f"CREATE VIEW {name} AS {query}")


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for name in reversed(list(VIEWS)):
        op.execute(f"DROP VIEW IF EXISTS {name}")
