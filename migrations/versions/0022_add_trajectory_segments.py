"""add each trajectory's segment of its rollout, and the ``trajectory_segments`` view

``trajectories.segment``: the trajectory as a segment of its session's rollout (``polar.reconstruction.segments``):
``index``, ``edge`` (null for the root; ``compaction``, ``spawn``, ``fork``, ``side``, ``rewrite``,
``unexplained``), ``parent``, ``call_id``, ``tool_call_id``, ``evidence``, ``trainable``. Null for rows stored
before this revision (nothing is backfilled). The feed's JSON carries it, and ``trajectory_segments`` has one row
per trajectory with its segment's fields as columns.

Revision ID: 0022
Revises: 0021
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None

# The feed's JSON of a row (migrations 0019 and 0021), now with ``segment``.
OLD_ROW_JSON = """CREATE OR REPLACE FUNCTION polar_trajectory_json(t trajectories) RETURNS text
    LANGUAGE sql STABLE AS $$
    SELECT json_build_object(
        'trajectory_id', t.id, 'session_id', t.session_id, 'agent', t.agent, 'reconstruction', t.reconstruction,
        'token_ids', t.token_ids, 'loss_mask', t.loss_mask,
        'logprobs', CASE WHEN t.logprobs && '{Infinity,-Infinity,NaN}'::real[] THEN ARRAY(
            SELECT CASE WHEN v IN ('Infinity', '-Infinity', 'NaN') THEN NULL ELSE v END
            FROM unnest(t.logprobs) WITH ORDINALITY AS u(v, n) ORDER BY n) ELSE t.logprobs END,
        'call_ids', t.call_ids, 'reward', t.reward, 'stats', t.stats, 'main', t.main)::text
$$"""
ROW_JSON = OLD_ROW_JSON.replace("'main', t.main)", "'main', t.main, 'segment', t.segment)")
SEGMENTS = """CREATE VIEW trajectory_segments AS
        SELECT s.batch_id, t.session_id, t.id AS trajectory_id, t.position, t.main,
               (t.segment ->> 'index')::int AS segment_index, t.segment ->> 'edge' AS edge,
               (t.segment ->> 'parent')::int AS parent, t.segment ->> 'call_id' AS call_id,
               t.segment ->> 'tool_call_id' AS tool_call_id, (t.segment ->> 'trainable')::boolean AS trainable,
               t.segment -> 'evidence' AS evidence, cardinality(t.call_ids) AS calls,
               (t.stats ->> 'completion_tokens')::int AS sampled_tokens
        FROM trajectories t JOIN sessions s ON s.id = t.session_id"""


def upgrade() -> None:
    segment = sa.JSON(none_as_null=True).with_variant(postgresql.JSONB(none_as_null=True), "postgresql")
    with op.batch_alter_table("trajectories") as batch:
        batch.add_column(sa.Column("segment", segment, nullable=True))
    if op.get_bind().dialect.name == "postgresql":
        op.execute(ROW_JSON)
        op.execute(SEGMENTS)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP VIEW trajectory_segments")
        op.execute(OLD_ROW_JSON)
    with op.batch_alter_table("trajectories") as batch:
        batch.drop_column("segment")
