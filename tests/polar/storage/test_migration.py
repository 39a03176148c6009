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
