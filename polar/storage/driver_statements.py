"""Core statements run straight on psycopg's cursor, for the few statements the proxy makes on every model call.

SQLAlchemy's execution of an already compiled and cached statement still cost the proxy about as much CPU as
psycopg's own execute (its execution context, bind set-up, result set-up and events: ~half of the two capture
statements' time in a CPU profile, docs/benchmarks.md). A ``DriverStatement`` is compiled once per dialect by
SQLAlchemy and run by psycopg on the connection SQLAlchemy checked out, keeping what matters of SQLAlchemy's
execution: the same SQL, the same bind processors (JSON serialisation, the array and int4 types), its exception
classes (``sa.exc.OperationalError`` and the rest, so outages are ridden out as before), and the invalidation of a
connection the database dropped. Rows come back as named tuples; psycopg already decodes every type these statements
read, as it does under SQLAlchemy. Any other database (SQLite) runs the statement through SQLAlchemy as before.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
import sqlalchemy as sa
from psycopg.rows import namedtuple_row
from sqlalchemy.sql.compiler import SQLCompiler


@dataclass(frozen=True)
class _Compiled:
    sql: str
    processors: Mapping[str, Any]  # bind name → SQLAlchemy's bind processor for its type
    fixed: Mapping[str, Any]  # the statement's own literal binds, processed
    names: Mapping[str, str]  # bind name → its name in the SQL, where SQLAlchemy escaped it


class DriverStatement:
    """``statement`` run on the psycopg connection behind an ``sa.Connection``."""

    def __init__(self, statement: sa.Executable) -> None:
        self.statement = statement
        self._compiled: dict[str, _Compiled] = {}

    def rows(self, connection: sa.Connection, params: Mapping[str, Any]) -> Sequence[Any]:
        """Every row, as named tuples (SQLAlchemy ``Row`` objects on other databases)."""
        if connection.dialect.driver != "psycopg":
            return connection.execute(self.statement, params).all()
        cursor = self._execute(connection, params)
        return cursor.fetchall() if cursor.description is not None else []

    def scalar(self, connection: sa.Connection, params: Mapping[str, Any]) -> Any:
        """The first column of the first row, or None."""
        if connection.dialect.driver != "psycopg":
            return connection.execute(self.statement, params).scalar()
        row = self._execute(connection, params).fetchone()
        return None if row is None else row[0]

    def _execute(self, connection: sa.Connection, params: Mapping[str, Any]) -> psycopg.Cursor[Any]:
        compiled = self._compile(connection.dialect)
        values = dict(compiled.fixed)
        for name, value in params.items():
            process = compiled.processors.get(name)
            values[compiled.names.get(name, name)] = process(value) if process is not None else value
        driver: psycopg.Connection[Any] = connection.connection.driver_connection  # type: ignore[assignment]
        try:
            # psycopg prepares it after a few runs on this connection, as it does under SQLAlchemy.
            return driver.cursor(row_factory=namedtuple_row).execute(compiled.sql, values)
        except psycopg.Error as exc:
            dropped = connection.dialect.is_disconnect(exc, driver, None)
            if dropped:
                connection.invalidate(exc)
            raise sa.exc.DBAPIError.instance(
                compiled.sql,
                values,
                exc,
                psycopg.Error,
                hide_parameters=connection.engine.hide_parameters,  # as the engine's own errors would
                connection_invalidated=dropped,
                dialect=connection.dialect,
            ) from exc

    def _compile(self, dialect: sa.Dialect) -> _Compiled:
        found = self._compiled.get(dialect.name)
        if found is not None:
            return found
        compiled = self.statement.compile(dialect=dialect)
        assert isinstance(compiled, SQLCompiler)
        if compiled.positional or compiled.literal_execute_params or compiled.post_compile_params:
            raise ValueError("a DriverStatement takes named binds only, none expanded at execution")
        processors = dict(compiled._bind_processors)
        names = dict(compiled.escaped_bind_names)
        fixed = {}
        for name, bind in compiled.binds.items():
            if not bind.required:
                value = bind.effective_value
                process = processors.get(name)
                fixed[names.get(name, name)] = process(value) if process is not None else value
        found = self._compiled[dialect.name] = _Compiled(compiled.string, processors, fixed, names)
        return found
