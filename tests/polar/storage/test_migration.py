"""``alembic upgrade head`` on an empty Postgres must produce exactly the models' schema."""

from __future__ import annotations

import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from polar.storage.migration import downgrade, upgrade
from polar.storage.models import Base


def _differences(url: str, server_defaults: bool = True) -> list[object]:
    engine = sa.create_engine(url)
    with engine.connect() as connection:
        options = {"compare_type": True, "compare_server_default": server_defaults}
        context = MigrationContext.configure(connection, opts=options)
        diff = compare_metadata(context, Base.metadata)
    engine.dispose()
    return diff


def test_head_matches_models(empty_database_url: str) -> None:
    upgrade(empty_database_url)
    assert _differences(empty_database_url) == []


def test_token_columns_are_postgres_arrays(empty_database_url: str) -> None:
    upgrade(empty_database_url)
    engine = sa.create_engine(empty_database_url)
    with engine.connect() as connection:
        types = dict(
            connection.execute(
                sa.text(
                    "SELECT table_name || '.' || column_name, udt_name FROM information_schema.columns "
                    "WHERE column_name IN ('prompt_token_ids', 'completion_token_ids', 'logprobs', 'token_ids', "
                    "'loss_mask')"
                )
            ).all()
        )
    engine.dispose()
    assert types["model_calls.prompt_token_ids"] == "_int4"
    assert types["model_calls.logprobs"] == "_float4"
    assert types["trajectories.loss_mask"] == "_int2"


def test_downgrade_removes_everything(empty_database_url: str) -> None:
    upgrade(empty_database_url)
    downgrade(empty_database_url, "base")
    engine = sa.create_engine(empty_database_url)
    assert set(sa.inspect(engine).get_table_names()) <= {"alembic_version"}
    engine.dispose()


def test_sqlite_embedded_schema(tmp_path: object) -> None:
    url = f"sqlite:///{tmp_path}/polar.db"
    upgrade(url)
    # SQLite reflects CURRENT_TIMESTAMP where the models say now(); Alembic cannot compare those, so skip defaults.
    assert _differences(url, server_defaults=False) == []


def test_call_payloads_compress_with_lz4(empty_database_url: str) -> None:
    """Postgres compresses a call's JSON payloads inside the insert its answer waits for, and decompresses the feed's
    JSON on every page: lz4, not pglz (0020)."""
    engine = sa.create_engine(empty_database_url)
    compression = sa.text(
        "SELECT attname, attcompression FROM pg_attribute WHERE attrelid IN ('model_calls'::regclass, "
        "'trajectories'::regclass) AND attname IN ('request', 'normalized_request', 'response', 'payload_index', "
        "'prompt_token_ids', 'feed_json')"
    )
    upgrade(empty_database_url)
    with engine.connect() as connection:
        lz4 = connection.execute(
            sa.text("SELECT 'lz4' = ANY(enumvals) FROM pg_settings WHERE name = 'default_toast_compression'")
        ).scalar()
        after = dict(connection.execute(compression).all())
        # A call's payload as the insert writes it: FKs off (no session), a response past TOAST's threshold.
        connection.execute(sa.text("SET session_replication_role = replica"))
        connection.execute(
            sa.text(
                "INSERT INTO model_calls (id, session_id, seq, provider, stream, prompt_token_ids, "
                "completion_token_ids, logprobs, status_code, latency_ms, request, normalized_request, response, "
                "prompt_len) VALUES (gen_random_uuid(), gen_random_uuid(), 1, 'openai_chat', false, '{}', '{}', "
                "'{}', 200, 1, '{}', '{}', json_build_object('text', repeat('the answer ', 2000)), 0)"
            )
        )
        written = connection.execute(sa.text("SELECT pg_column_compression(response) FROM model_calls")).scalar()
        connection.rollback()
    downgrade(empty_database_url, "0019")
    with engine.connect() as connection:
        before = dict(connection.execute(compression).all())
    engine.dispose()
    assert lz4, "this Postgres was built without lz4: the revision leaves pglz (nothing to check here)"
    assert after == {"request": "l", "normalized_request": "l", "response": "l", "payload_index": "l",
                     "prompt_token_ids": "", "feed_json": "l"}  # fmt: skip
    assert written == "lz4"
    assert set(before.values()) == {""}
