"""store captured payloads as deltas on an earlier call of the same session

A call with ``payload_parent_id`` stores its ``request``, ``normalized_request`` and ``response`` as deltas on the
same payloads of that call (``polar.storage.payloads``); ``payload_index`` holds the hashes a later call diffs
against. Existing rows keep their payloads whole (``payload_parent_id`` NULL).

On Postgres, ``polar_call_payload(id, part)`` rebuilds one payload and the view ``model_calls_full`` shows every
call's payloads whole (its columns are unchanged; ``payload_parent_id`` is added at the end).

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

PARTS = ("request", "normalized_request", "response")

# One delta applied to its parent's payload (the operations are documented in polar/storage/payloads.py). Objects are
# rebuilt as text so their keys keep their order; a "t" operation is the call's own full prompt.
APPLY = """
CREATE FUNCTION polar_payload_apply(base json, ops json, call_id uuid) RETURNS json LANGUAGE plpgsql STABLE AS $$
DECLARE
    op json;
    kind text;
    value json;
    members text[] := '{}';
BEGIN
    FOR op IN SELECT element FROM json_array_elements(ops) AS e(element) LOOP
        kind := op->>1;
        IF kind = '=' THEN
            value := base -> (op->>0);
        ELSIF kind = 'v' THEN
            value := op -> 2;
        ELSIF kind = '+' THEN
            SELECT coalesce(json_agg(item ORDER BY position), '[]'::json) INTO value FROM (
                SELECT item, position
                FROM json_array_elements(base -> (op->>0)) WITH ORDINALITY AS a(item, position)
                WHERE position <= (op->>2)::bigint
                UNION ALL
                SELECT item, (op->>2)::bigint + position
                FROM json_array_elements(op -> 3) WITH ORDINALITY AS b(item, position)
            ) AS items;
        ELSIF kind = '{' THEN
            value := polar_payload_apply(base -> (op->>0), op -> 2, call_id);
        ELSIF kind = 't' THEN
            value := to_json(polar_full_prompt(call_id));
        ELSE
            RAISE EXCEPTION 'unknown payload delta operation %', kind;
        END IF;
        members := members || (to_json(op->>0)::text || ':' || coalesce(value::text, 'null'));
    END LOOP;
    RETURN ('{' || array_to_string(members, ',') || '}')::json;
END $$"""

# Walk up to the call that stores the payload whole, then apply the deltas downwards.
CALL_PAYLOAD = """
CREATE FUNCTION polar_call_payload(call_id uuid, part text) RETURNS json LANGUAGE plpgsql STABLE AS $$
DECLARE
    chain uuid[];
    stored json;
    value json;
BEGIN
    IF part NOT IN ('request', 'normalized_request', 'response') THEN
        RAISE EXCEPTION 'polar_call_payload: part must be request, normalized_request or response, not %', part;
    END IF;
    WITH RECURSIVE up AS (
        SELECT c.id, c.payload_parent_id, 1 AS depth FROM model_calls c WHERE c.id = call_id
        UNION ALL
        SELECT c.id, c.payload_parent_id, up.depth + 1 FROM up JOIN model_calls c ON c.id = up.payload_parent_id
    )
    SELECT array_agg(id ORDER BY depth DESC) INTO chain FROM up;
    IF chain IS NULL THEN
        RETURN NULL;
    END IF;
    FOR i IN 1 .. array_length(chain, 1) LOOP
        EXECUTE format('SELECT %I FROM model_calls WHERE id = $1', part) INTO stored USING chain[i];
        IF i = 1 THEN
            value := stored;
        ELSIF (stored -> 'value') IS NOT NULL THEN
            value := stored -> 'value';
        ELSE
            value := polar_payload_apply(value, stored -> 'delta', chain[i]);
        END IF;
    END LOOP;
    RETURN value;
END $$"""


def _full_view(payloads: bool) -> str:
    def part(name: str) -> str:
        if not payloads:
            return name
        return f"CASE WHEN payload_parent_id IS NULL THEN {name} ELSE polar_call_payload(id, '{name}') END AS {name}"

    tail = ", payload_parent_id" if payloads else ""
    return f"""CREATE OR REPLACE VIEW model_calls_full AS SELECT id, session_id, seq, agent, provider, model, stream,
    CASE WHEN prompt_parent_id IS NULL THEN prompt_token_ids ELSE polar_full_prompt(id) END AS prompt_token_ids,
    completion_token_ids, logprobs, finish_reason, status_code, latency_ms, engine_latency_ms, engine_url,
    policy_version, {part("request")}, {part("normalized_request")}, {part("response")}, created_at,
    prompt_parent_id, prompt_prefix_len, prompt_len, chain_hash{tail} FROM model_calls"""


def upgrade() -> None:
    with op.batch_alter_table("model_calls") as batch:
        batch.add_column(sa.Column("payload_parent_id", sa.Uuid(), nullable=True))
        batch.add_column(sa.Column("payload_index", sa.JSON(), nullable=True))
        batch.create_foreign_key(
            op.f("fk_model_calls_payload_parent_id_model_calls"), "model_calls", ["payload_parent_id"], ["id"]
        )
    # Deleting a session's calls checks each for children: without this index, one scan of the table per call.
    op.create_index("ix_model_calls_payload_parent_id", "model_calls", ["payload_parent_id"], unique=False)
    if op.get_bind().dialect.name == "postgresql":
        op.execute(APPLY)
        op.execute(CALL_PAYLOAD)
        op.execute(_full_view(payloads=True))


def _materialize_sqlite(bind: Any) -> None:
    """Write every delta-stored payload back whole (SQLite has no ``polar_call_payload``)."""
    from polar.storage.payloads import full_payloads  # the decoder is pure; the schema here is this revision's
    from polar.storage.prompts import full_prompts

    names = ("id", "session_id", "seq", "prompt_parent_id", "prompt_prefix_len", "payload_parent_id")
    calls = sa.table(
        "model_calls",
        *(sa.column(name) for name in names),
        *(sa.column(name, sa.JSON()) for name in ("prompt_token_ids", "completion_token_ids", *PARTS)),
    )
    rows = bind.execute(sa.select(calls).order_by(calls.c.session_id, calls.c.seq)).all()
    payloads = full_payloads(rows, full_prompts(rows))
    for row in rows:
        if row.payload_parent_id is not None:
            bind.execute(sa.update(calls).where(calls.c.id == row.id).values(payloads[row.id]))


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "postgresql":
        whole = ", ".join(f"polar_call_payload(id, '{name}') AS {name}_full" for name in PARTS)
        op.execute(
            f"CREATE TEMPORARY TABLE polar_full_payloads ON COMMIT DROP AS SELECT id, {whole} "
            "FROM model_calls WHERE payload_parent_id IS NOT NULL"
        )
        assignments = ", ".join(f"{name} = f.{name}_full" for name in PARTS)
        op.execute(f"UPDATE model_calls c SET {assignments} FROM polar_full_payloads f WHERE c.id = f.id")
        op.execute("DROP VIEW model_calls_full")
        op.execute(_full_view(payloads=False).replace("CREATE OR REPLACE VIEW", "CREATE VIEW"))
        op.execute("DROP FUNCTION polar_call_payload(uuid, text)")
        op.execute("DROP FUNCTION polar_payload_apply(json, json, uuid)")
    else:
        _materialize_sqlite(bind)
    op.drop_index("ix_model_calls_payload_parent_id", table_name="model_calls")
    with op.batch_alter_table("model_calls") as batch:
        batch.drop_constraint(op.f("fk_model_calls_payload_parent_id_model_calls"), type_="foreignkey")
        batch.drop_column("payload_index")
        batch.drop_column("payload_parent_id")
