"""add the audit log (who submitted, cancelled, paused, exported) and each batch's submitter and provenance

``audit_log`` is append-only; the ``audit_trail`` view names each row's batch when it acted on one.
``batches.provenance`` records what produced a batch's results (Polar's version, the configuration digest, the
engines' served models and versions) and ``batches.submitted_by`` the token role that submitted it.
Partial indexes on ``sessions.retry_of`` / ``retried_as`` make deleting old sessions (``polar gc``) cheap.

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

_JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")

AUDIT_TRAIL = """
SELECT a.id, a.at, a.actor, a.action, a.target, a.remote_addr, a.detail, b.id AS batch_id, b.name AS batch_name
FROM audit_log a
LEFT JOIN batches b ON b.id::text = a.target
"""


def upgrade() -> None:
    with op.batch_alter_table("batches") as batch:
        batch.add_column(sa.Column("submitted_by", sa.Text(), nullable=True))
        batch.add_column(sa.Column("provenance", _JSON, nullable=True))
    op.create_table(
        "audit_log",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("actor", sa.Text(), nullable=False),
        sa.Column("action", sa.Text(), nullable=False),
        sa.Column("target", sa.Text(), nullable=True),
        sa.Column("remote_addr", sa.Text(), nullable=True),
        sa.Column("detail", _JSON, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_log")),
    )
    op.create_index("ix_audit_log_at", "audit_log", ["at"])
    # ``polar gc`` deletes sessions: each delete looks for attempts linked to the session (``ON DELETE SET NULL``),
    # a scan of the whole table per session without these (62 s per 1,000 sessions among 100,000).
    for column in ("retry_of", "retried_as"):
        op.create_index(
            f"ix_sessions_{column}",
            "sessions",
            [column],
            postgresql_where=sa.text(f"{column} IS NOT NULL"),
            sqlite_where=sa.text(f"{column} IS NOT NULL"),
        )
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"CREATE VIEW audit_trail AS {AUDIT_TRAIL}")
    else:  # SQLite stores a UUID as 32 hex digits without dashes
        sqlite_join = AUDIT_TRAIL.replace("b.id::text = a.target", "b.id = replace(a.target, '-', '')")
        op.execute(f"CREATE VIEW audit_trail AS {sqlite_join}")


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS audit_trail")
    op.drop_index("ix_sessions_retried_as", table_name="sessions")
    op.drop_index("ix_sessions_retry_of", table_name="sessions")
    op.drop_index("ix_audit_log_at", table_name="audit_log")
    op.drop_table("audit_log")
    with op.batch_alter_table("batches") as batch:
        batch.drop_column("provenance")
        batch.drop_column("submitted_by")
