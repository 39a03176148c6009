"""compress the captured calls' JSON payloads and the feed's JSON with lz4

A captured call's row is past TOAST's 2 KB threshold, so Postgres compresses its largest values inside the insert the
answer waits for. With the default method, pglz, that cost ~0.35 ms an agent-size call on this project's machine
(docs/benchmarks.md, ninth stop), more than the rest of the insert's execution. lz4 compresses the JSON payloads
3-4x faster and reads them back faster too. On those calls it stores the response and the payload index in as many
bytes as pglz, the request and the normalised request in ~300 bytes more each; the token-id arrays stay on pglz,
which packs them ~900 bytes smaller for ~0.09 ms.

The feed's page of 10 groups reads 1,000 trajectories' ``feed_json``, megabytes of JSON text that Postgres
decompresses on every read: 1,000 rows of 12 KB read back in 55 ms with lz4 against pglz's 87-89 ms, for ~1 KB more
a row.

It applies to values written from now on; stored rows keep their pglz values, which read as before. A server built
without lz4 (or older than Postgres 14) keeps pglz: the revision checks ``default_toast_compression``'s choices.

Revision ID: 0020
Revises: 0019
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

COLUMNS = {
    "model_calls": ("request", "normalized_request", "response", "payload_index"),
    "trajectories": ("feed_json",),
}


def _lz4_available() -> bool:
    found = op.get_bind().execute(
        sa.text("SELECT 'lz4' = ANY(enumvals) FROM pg_settings WHERE name = 'default_toast_compression'")
    )
    return bool(found.scalar())


def _set_compression(method: str) -> None:
    for table, columns in COLUMNS.items():
        clauses = ", ".join(f"ALTER COLUMN {column} SET COMPRESSION {method}" for column in columns)
        op.execute(f"ALTER TABLE {table} {clauses}")


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql" and _lz4_available():
        _set_compression("lz4")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql" and _lz4_available():
        _set_compression("default")  # as before: the server's default_toast_compression
