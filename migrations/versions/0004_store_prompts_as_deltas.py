"""store prompts as deltas on an earlier call of the same session

A call whose prompt extends an earlier call's prompt + completion stores only the new tokens
(``prompt_token_ids``), the earlier call (``prompt_parent_id``) and how many leading tokens come from it
(``prompt_prefix_len``). ``prompt_len`` is the full prompt's length and ``chain_hash`` the sha256 of the full
prompt + completion, which later calls use to find their parent. Existing rows keep their full prompts.

On Postgres, ``polar_full_prompt(id)`` and the view ``model_calls_full`` give the full prompts back, and
``session_tokens`` counts prompt tokens from ``prompt_len``.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

# Walk up to the root call, then rebuild downwards: (parent's full prompt || its completion)[1:prefix] || delta.
FULL_PROMPT = """
CREATE FUNCTION polar_full_prompt(call_id uuid) RETURNS integer[] LANGUAGE sql STABLE AS $$
    WITH RECURSIVE up AS (
        SELECT c.id, c.prompt_parent_id, 1 AS depth FROM model_calls c WHERE c.id = call_id
        UNION ALL
        SELECT c.id, c.prompt_parent_id, up.depth + 1
        FROM up JOIN model_calls c ON c.id = up.prompt_parent_id
    ), down AS (
        SELECT up.depth, c.prompt_token_ids AS prompt, c.completion_token_ids AS completion
        FROM up JOIN model_calls c ON c.id = up.id WHERE up.prompt_parent_id IS NULL
        UNION ALL
        SELECT up.depth, (down.prompt || down.completion)[1:c.prompt_prefix_len] || c.prompt_token_ids,
               c.completion_token_ids
        FROM down JOIN up ON up.depth = down.depth - 1 JOIN model_calls c ON c.id = up.id
    )
    SELECT prompt FROM down WHERE depth = 1
$$"""

COLUMNS = """id, session_id, seq, agent, provider, model, stream,
    CASE WHEN prompt_parent_id IS NULL THEN prompt_token_ids ELSE polar_full_prompt(id) END AS prompt_token_ids,
    completion_token_ids, logprobs, finish_reason, status_code, latency_ms, engine_latency_ms, engine_url,
    policy_version, request, normalized_request, response, created_at, prompt_parent_id, prompt_prefix_len,
    prompt_len, chain_hash"""


def _session_tokens(prompt_tokens: str) -> str:
    return f"""
        SELECT s.id AS session_id, s.batch_id, s.task_id, s.sample_index, s.state, s.reward,
               count(c.id) AS calls,
               coalesce(sum({prompt_tokens}), 0) AS prompt_tokens,
               coalesce(sum(cardinality(c.completion_token_ids)), 0) AS completion_tokens,
               (SELECT count(*) FROM trajectories t WHERE t.session_id = s.id) AS trajectories
        FROM sessions s LEFT JOIN model_calls c ON c.session_id = s.id AND c.status_code = 200
        GROUP BY s.id"""


def upgrade() -> None:
    postgres = op.get_bind().dialect.name == "postgresql"
    with op.batch_alter_table("model_calls") as batch:
        batch.add_column(sa.Column("prompt_parent_id", sa.Uuid(), nullable=True))
        batch.add_column(sa.Column("prompt_prefix_len", sa.Integer(), server_default="0", nullable=False))
        batch.add_column(sa.Column("prompt_len", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("chain_hash", sa.Text(), nullable=True))
    length = "cardinality(prompt_token_ids)" if postgres else "json_array_length(prompt_token_ids)"
    op.execute(f"UPDATE model_calls SET prompt_len = coalesce({length}, 0)")
    with op.batch_alter_table("model_calls") as batch:
        batch.alter_column("prompt_len", existing_type=sa.Integer(), nullable=False)
        batch.create_foreign_key(
            op.f("fk_model_calls_prompt_parent_id_model_calls"), "model_calls", ["prompt_parent_id"], ["id"]
        )
    # Deleting a session's calls checks each for children: without this index, one scan of the table per call.
    op.create_index("ix_model_calls_prompt_parent_id", "model_calls", ["prompt_parent_id"], unique=False)
    if not postgres:
        return
    op.execute(FULL_PROMPT)
    op.execute(f"CREATE VIEW model_calls_full AS SELECT {COLUMNS} FROM model_calls")
    op.execute("DROP VIEW session_tokens")
    op.execute(f"CREATE VIEW session_tokens AS {_session_tokens('c.prompt_len')}")


def _materialize_sqlite(bind: Any) -> None:
    """Write every delta back as its full prompt (SQLite has no ``polar_full_prompt``)."""
    calls = sa.table(
        "model_calls",
        *(sa.column(name) for name in ("id", "session_id", "seq", "prompt_parent_id", "prompt_prefix_len")),
        sa.column("prompt_token_ids", sa.JSON()),
        sa.column("completion_token_ids", sa.JSON()),
    )
    full: dict[Any, list[int]] = {}
    completions: dict[Any, list[int]] = {}
    for row in bind.execute(sa.select(calls).order_by(calls.c.session_id, calls.c.seq)):
        prompt = list(row.prompt_token_ids)
        if row.prompt_parent_id is not None:
            parent = row.prompt_parent_id
            prompt = [*full[parent], *completions[parent]][: row.prompt_prefix_len] + prompt
            bind.execute(sa.update(calls).where(calls.c.id == row.id).values(prompt_token_ids=prompt))
        full[row.id], completions[row.id] = prompt, list(row.completion_token_ids)


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "postgresql":
        op.execute("DROP VIEW session_tokens")
        op.execute(f"CREATE VIEW session_tokens AS {_session_tokens('cardinality(c.prompt_token_ids)')}")
        op.execute("DROP VIEW model_calls_full")
        op.execute(
            "CREATE TEMPORARY TABLE polar_full_prompts ON COMMIT DROP AS SELECT id, polar_full_prompt(id) AS prompt "
            "FROM model_calls WHERE prompt_parent_id IS NOT NULL"
        )
        op.execute("UPDATE model_calls c SET prompt_token_ids = f.prompt FROM polar_full_prompts f WHERE c.id = f.id")
        op.execute("DROP FUNCTION polar_full_prompt(uuid)")
    else:
        _materialize_sqlite(bind)
    op.drop_index("ix_model_calls_prompt_parent_id", table_name="model_calls")
    with op.batch_alter_table("model_calls") as batch:
        batch.drop_constraint(op.f("fk_model_calls_prompt_parent_id_model_calls"), type_="foreignkey")
        batch.drop_column("chain_hash")
        batch.drop_column("prompt_len")
        batch.drop_column("prompt_prefix_len")
        batch.drop_column("prompt_parent_id")
