"""add why the engine failed a call, when a pause first held a session, and which trajectories are the main chain

``model_calls.failure_kind``: for a call the engine failed, why (``unreachable``, ``engine_error``,
``engine_timeout``, ``generation_timeout``). A ``generation_timeout`` is a call that was still generating on a
healthy engine when the engine timeout came: the policy asked for more than fits, and postrun does not count it
against the infrastructure (``polar.lifecycle.attempts``).

``sessions.pause_held_at``: when the current weight-sync pause first refused or held one of the session's calls
(null when it has not). Only a held session's budget is frozen, and only that time is given back at resume
(``polar.lifecycle.budget``), which clears it on every session (a partial index finds the few set).
``sessions.budget_started_at``: when the harness's budget started (after the wait for an engine): no credit
reaches back before it.

``trajectories.main``: whether the trajectory is the session's main chain (the first call's agent and what
continues it) rather than a side call (a title request, a tool's own use of the key). The feed's JSON carries it,
and the ``merge_breaks`` view gains it at its end (whether the trajectory a break started is main: a compaction of
the main chain, or a side conversation).

Revision ID: 0021
Revises: 0020
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

# The feed's JSON of a row (migration 0019), now with ``main``.
ROW_JSON = """CREATE OR REPLACE FUNCTION polar_trajectory_json(t trajectories) RETURNS text LANGUAGE sql STABLE AS $$
    SELECT json_build_object(
        'trajectory_id', t.id, 'session_id', t.session_id, 'agent', t.agent, 'reconstruction', t.reconstruction,
        'token_ids', t.token_ids, 'loss_mask', t.loss_mask,
        'logprobs', CASE WHEN t.logprobs && '{Infinity,-Infinity,NaN}'::real[] THEN ARRAY(
            SELECT CASE WHEN v IN ('Infinity', '-Infinity', 'NaN') THEN NULL ELSE v END
            FROM unnest(t.logprobs) WITH ORDINALITY AS u(v, n) ORDER BY n) ELSE t.logprobs END,
        'call_ids', t.call_ids, 'reward', t.reward, 'stats', t.stats, 'main', t.main)::text
$$"""
OLD_ROW_JSON = ROW_JSON.replace(", 'main', t.main)", ")")
HELD = "pause_held_at IS NOT NULL"

# ``merge_breaks`` as migration 0012 left it, and with the trajectory's ``main`` at its end.
OLD_BREAKS = """CREATE VIEW merge_breaks AS
        SELECT s.batch_id, t.session_id, t.id AS trajectory_id, b ->> 'reason' AS reason,
               b ->> 'call_id' AS call_id, (b ->> 'seq')::int AS seq, b ->> 'agent' AS agent,
               (b ->> 'position')::int AS position, (b ->> 'expected_token')::int AS expected_token,
               (b ->> 'actual_token')::int AS actual_token,
               (b ->> 'message_index')::int AS message_index, b ->> 'detail' AS detail
        FROM trajectories t JOIN sessions s ON s.id = t.session_id
        CROSS JOIN LATERAL jsonb_array_elements(
            CASE WHEN jsonb_typeof(t.stats -> 'breaks') = 'array' THEN t.stats -> 'breaks' ELSE '[]'::jsonb END
        ) AS b"""
BREAKS = OLD_BREAKS.replace("CREATE VIEW", "CREATE OR REPLACE VIEW").replace(
    "b ->> 'detail' AS detail", "b ->> 'detail' AS detail, t.main"
)


def upgrade() -> None:
    with op.batch_alter_table("model_calls") as batch:
        batch.add_column(sa.Column("failure_kind", sa.Text(), nullable=True))
    with op.batch_alter_table("sessions") as batch:
        batch.add_column(sa.Column("pause_held_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("budget_started_at", sa.DateTime(timezone=True), nullable=True))
    op.create_index("ix_sessions_pause_held_at", "sessions", ["pause_held_at"], postgresql_where=sa.text(HELD),
                    sqlite_where=sa.text(HELD))  # fmt: skip
    with op.batch_alter_table("trajectories") as batch:
        batch.add_column(sa.Column("main", sa.Boolean(), nullable=False, server_default=sa.true()))
    if op.get_bind().dialect.name == "postgresql":
        op.execute(ROW_JSON)
        op.execute(BREAKS)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(OLD_ROW_JSON)
        op.execute("DROP VIEW merge_breaks")  # a view's columns can be added, never dropped, by CREATE OR REPLACE
        op.execute(OLD_BREAKS)
    with op.batch_alter_table("trajectories") as batch:
        batch.drop_column("main")
    op.drop_index("ix_sessions_pause_held_at", table_name="sessions")
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("budget_started_at")
        batch.drop_column("pause_held_at")
    with op.batch_alter_table("model_calls") as batch:
        batch.drop_column("failure_kind")
