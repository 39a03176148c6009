"""add images: ``media_objects`` (bytes stored once), each call's and each trajectory's ``media``, ``call_media``

``media_objects``: an image's bytes, content-addressed by their sha256 (hex), with media type, size and dimensions;
written once per deployment however many calls send it (``polar.storage.media``). ``model_calls.media``: the call's
images in prompt order (``sha256``, ``media_type``, ``message_index``, ``source``, ``offset``, ``length`` in the
call's expanded prompt ids, ``image_token_id``, ``model``); the stored payloads hold a reference in place of each
image's base64. ``trajectories.media``: the spans of a trajectory's images, offsets into its token ids, with the call
that brought each in; the feed's JSON carries it. ``call_media``: one row per image of a call, for SQL. NULL for
rows stored before this revision and for calls without images.

Revision ID: 0023
Revises: 0022
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None

# The feed's JSON of a row (migrations 0019, 0021, 0022), now with ``media``.
OLD_ROW_JSON = """CREATE OR REPLACE FUNCTION polar_trajectory_json(t trajectories) RETURNS text
    LANGUAGE sql STABLE AS $$
    SELECT json_build_object(
        'trajectory_id', t.id, 'session_id', t.session_id, 'agent', t.agent, 'reconstruction', t.reconstruction,
        'token_ids', t.token_ids, 'loss_mask', t.loss_mask,
        'logprobs', CASE WHEN t.logprobs && '{Infinity,-Infinity,NaN}'::real[] THEN ARRAY(
            SELECT CASE WHEN v IN ('Infinity', '-Infinity', 'NaN') THEN NULL ELSE v END
            FROM unnest(t.logprobs) WITH ORDINALITY AS u(v, n) ORDER BY n) ELSE t.logprobs END,
        'call_ids', t.call_ids, 'reward', t.reward, 'stats', t.stats, 'main', t.main, 'segment', t.segment)::text
$$"""
# ``media`` is [] for a trajectory without images (and for rows stored before this revision).
ROW_JSON = OLD_ROW_JSON.replace(
    "'segment', t.segment)", "'segment', t.segment, 'media', coalesce(t.media, '[]'::jsonb))"
)
CALL_MEDIA = """CREATE VIEW call_media AS
        SELECT c.session_id, c.id AS call_id, c.seq, m.position - 1 AS position, m.item ->> 'sha256' AS sha256,
               m.item ->> 'media_type' AS media_type, m.item ->> 'source' AS source,
               (m.item ->> 'message_index')::int AS message_index, (m.item ->> 'offset')::int AS "offset",
               (m.item ->> 'length')::int AS length, o.size, o.width, o.height
        FROM model_calls c
        CROSS JOIN LATERAL jsonb_array_elements(c.media) WITH ORDINALITY AS m(item, position)
        LEFT JOIN media_objects o ON o.sha256 = m.item ->> 'sha256'
        WHERE c.media IS NOT NULL"""


def _document() -> sa.types.TypeEngine[object]:
    return sa.JSON(none_as_null=True).with_variant(postgresql.JSONB(none_as_null=True), "postgresql")


def upgrade() -> None:
    op.create_table(
        "media_objects",
        sa.Column("sha256", sa.Text(), nullable=False),
        sa.Column("media_type", sa.Text(), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("width", sa.Integer(), nullable=True),
        sa.Column("height", sa.Integer(), nullable=True),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.PrimaryKeyConstraint("sha256", name=op.f("pk_media_objects")),
    )
    with op.batch_alter_table("model_calls") as batch:
        batch.add_column(sa.Column("media", _document(), nullable=True))
    with op.batch_alter_table("trajectories") as batch:
        batch.add_column(sa.Column("media", _document(), nullable=True))
    if op.get_bind().dialect.name == "postgresql":
        op.execute(ROW_JSON)
        op.execute(CALL_MEDIA)
    where = sa.text("media IS NOT NULL")
    op.create_index("ix_model_calls_media", "model_calls", ["session_id"], postgresql_where=where, sqlite_where=where)


def downgrade() -> None:
    op.drop_index("ix_model_calls_media", table_name="model_calls")
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP VIEW call_media")
        op.execute(OLD_ROW_JSON)
    with op.batch_alter_table("trajectories") as batch:
        batch.drop_column("media")
    with op.batch_alter_table("model_calls") as batch:
        batch.drop_column("media")
    op.drop_table("media_objects")
