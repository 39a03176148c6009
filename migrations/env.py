"""Alembic environment: the URL comes from ``sqlalchemy.url`` set by ``polar db upgrade`` or POLAR_DATABASE_URL."""

from __future__ import annotations

import os

import sqlalchemy as sa
from alembic import context

from polar.storage.models import Base

config = context.config
target_metadata = Base.metadata


def _url() -> str:
    return config.get_main_option("sqlalchemy.url") or os.environ["POLAR_DATABASE_URL"]


def run_migrations_offline() -> None:
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    engine = sa.create_engine(_url(), poolclass=sa.pool.NullPool)
    with engine.connect() as connection:
        if connection.dialect.name == "postgresql":
            # A migration must never queue behind live traffic for long: fail fast and retry instead.
            connection.exec_driver_sql("SET lock_timeout = '5s'")
            connection.exec_driver_sql("SET statement_timeout = '120s'")
            connection.commit()  # end the implicit transaction so Alembic's own one commits the migration
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            render_as_batch=connection.dialect.name == "sqlite",
        )
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
