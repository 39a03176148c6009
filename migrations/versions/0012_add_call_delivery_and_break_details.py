"""Add model_calls.delivered, and the break reason's message and detail to merge_breaks.

A call is captured before its answer is sent, so none is lost; ``delivered`` is false when the answer then never
reached the harness (the client was gone, or its run had ended), and trajectories leave such calls out. The
``model_calls_full`` view gains the column at its end; ``merge_breaks`` gains ``message_index`` and ``detail``
(``polar.reconstruction.break_reasons``).

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

_BREAKS = """CREATE OR REPLACE VIEW merge_breaks AS
        SELECT s.batch_id, t.session_id, t.id AS trajectory_id, b ->> 'reason' AS reason,
               b ->> 'call_id' AS call_id, (b ->> 'seq')::int AS seq, b ->> 'agent' AS agent,
               (b ->> 'position')::int AS position, (b ->> 'expected_token')::int AS expected_token,
               (b ->> 'actual_token')::int AS actual_token{extra}
        FROM trajectories t JOIN sessions s ON s.id = t.session_id
        CROSS JOIN LATERAL jsonb_array_elements(
            CASE WHEN jsonb_typeof(t.stats -> 'breaks') = 'array' THEN t.stats -> 'breaks' ELSE '[]'::jsonb END
        ) AS b"""
_DETAILS = ",\n               (b ->> 'message_index')::int AS message_index, b ->> 'detail' AS detail"


def _full_view(delivered: bool) -> str:
    part = "CASE WHEN payload_parent_id IS NULL THEN {0} ELSE polar_call_payload(id, '{0}') END AS {0}".format
    tail = ", delivered" if delivered else ""
    return f"""CREATE OR REPLACE VIEW model_calls_full AS SELECT id, session_id, seq, agent, provider, model, stream,
    CASE WHEN prompt_parent_id IS NULL THEN prompt_token_ids ELSE polar_full_prompt(id) END AS prompt_token_ids,
    completion_token_ids, logprobs, finish_reason, status_code, latency_ms, engine_latency_ms, engine_url,
    policy_version, {part("request")}, {part("normalized_request")}, {part("response")}, created_at,
    prompt_parent_id, prompt_prefix_len, prompt_len, chain_hash, payload_parent_id{tail} FROM model_calls"""


def upgrade() -> None:
    op.add_column("model_calls", sa.Column("delivered", sa.Boolean(), nullable=False, server_default=sa.true()))
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_full_view(delivered=True))
        op.execute(_BREAKS.format(extra=_DETAILS))


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP VIEW merge_breaks")
        op.execute(_BREAKS.format(extra="").replace("CREATE OR REPLACE VIEW", "CREATE VIEW"))
        op.execute("DROP VIEW model_calls_full")
        op.execute(_full_view(delivered=False).replace("CREATE OR REPLACE VIEW", "CREATE VIEW"))
    with op.batch_alter_table("model_calls") as batch:
        batch.drop_column("delivered")
