"""store each trajectory's part of its feed item as JSON text

The feed (``GET /v1/trajectories``) answers a page of 10 groups of 100 with 1,000 trajectories: ~600,000 array
elements. Read as arrays, psycopg parsed them into Python lists and the API wrote them back as JSON; written as JSON
by Postgres per read, the page still cost ~65 ms of ``json_build_object``. ``trajectories.feed_json`` holds that JSON
(``polar.serialization.stored_trajectory_json``: the row's columns, no expert routing), written by a trigger on every
insert and update with ``polar_trajectory_json(row)``, so it can never disagree with the row whoever writes it. The
feed reads it, and calls the same function for rows stored before this revision (NULL here: nothing is
backfilled). SQLite (embedded mode) has no trigger: its feed builds the JSON in Python.

Revision ID: 0019
Revises: 0018
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

# One definition of the JSON, for the trigger and for the feed's rows stored before this revision. A logprob that is
# no number (-Infinity, NaN) is written null, as orjson writes it everywhere else (Postgres would write a string); the
# overlap test is one C-level pass, and only such an array is rebuilt. STABLE, not IMMUTABLE: a float's text follows
# the session's ``extra_float_digits``.
ROW_JSON = """CREATE FUNCTION polar_trajectory_json(t trajectories) RETURNS text LANGUAGE sql STABLE AS $$
    SELECT json_build_object(
        'trajectory_id', t.id, 'session_id', t.session_id, 'agent', t.agent, 'reconstruction', t.reconstruction,
        'token_ids', t.token_ids, 'loss_mask', t.loss_mask,
        'logprobs', CASE WHEN t.logprobs && '{Infinity,-Infinity,NaN}'::real[] THEN ARRAY(
            SELECT CASE WHEN v IN ('Infinity', '-Infinity', 'NaN') THEN NULL ELSE v END
            FROM unnest(t.logprobs) WITH ORDINALITY AS u(v, n) ORDER BY n) ELSE t.logprobs END,
        'call_ids', t.call_ids, 'reward', t.reward, 'stats', t.stats)::text
$$"""
STORE = """CREATE FUNCTION polar_store_trajectory_json() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.feed_json := polar_trajectory_json(NEW);
    RETURN NEW;
END $$"""
TRIGGER = """CREATE TRIGGER trajectories_feed_json BEFORE INSERT OR UPDATE ON trajectories
    FOR EACH ROW EXECUTE FUNCTION polar_store_trajectory_json()"""


def upgrade() -> None:
    op.add_column("trajectories", sa.Column("feed_json", sa.Text(), nullable=True))
    if op.get_bind().dialect.name == "postgresql":
        op.execute(ROW_JSON)
        op.execute(STORE)
        op.execute(TRIGGER)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER trajectories_feed_json ON trajectories")
        op.execute("DROP FUNCTION polar_store_trajectory_json()")
        op.execute("DROP FUNCTION polar_trajectory_json(trajectories)")
    with op.batch_alter_table("trajectories") as batch:
        batch.drop_column("feed_json")
