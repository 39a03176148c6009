"""Each test's fresh database, reused: a test process keeps the databases its tests have finished with, emptied,
and hands them to its next tests.

Copying the template is what made a fresh database dear: ``CREATE DATABASE ... TEMPLATE`` writes every page of the
copy's catalogs to the WAL, and with its ``DROP`` it cost Postgres ~190 ms of CPU (measured, 20 of them), for each
of some 450 tests. Emptying a used one costs a few milliseconds. A database is reused only when it is as the
template left it but for its rows: its schema fingerprint (``_FINGERPRINT``: relations, columns and their
compression, access rights, functions, triggers, the migration revision) must equal the template's, so a test that
downgraded, altered or granted leaves its database to be dropped, as before. Any connection still open on it is
ended first, as ``DROP DATABASE ... WITH (FORCE)`` did.
"""

from __future__ import annotations

import psycopg

from polar.storage.scratch import create_database, drop_database

_FINGERPRINT = """
SELECT md5(concat_ws('|',
  (SELECT string_agg(c.relname || ':' || c.relkind::text || ':' || coalesce(c.relacl::text, '')
                     || ':' || coalesce(pg_get_viewdef(c.oid), ''), ',' ORDER BY c.relname)
   FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'public'),
  (SELECT string_agg(a.attrelid::regclass::text || '.' || a.attname || ':' || a.atttypid || ':' || a.attnotnull
                     || ':' || a.attcompression::text || ':' || coalesce(pg_get_expr(d.adbin, d.adrelid), ''), ','
                     ORDER BY 1)
   FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
   LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
   WHERE n.nspname = 'public' AND a.attnum > 0 AND NOT a.attisdropped),
  (SELECT string_agg(p.proname || ':' || md5(p.prosrc), ',' ORDER BY 1)
   FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'public'),
  (SELECT string_agg(t.tgname || ':' || t.tgrelid::regclass::text || ':' || t.tgenabled::text, ',' ORDER BY 1)
   FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace
   WHERE n.nspname = 'public'),
  (SELECT string_agg(version_num, ',') FROM alembic_version)
))
"""

_TABLES = """
SELECT quote_ident(c.relname) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p') AND c.relname <> 'alembic_version'
"""

_SEQUENCES = """
SELECT c.oid::regclass::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'public' AND c.relkind = 'S'
"""


def _connect(url: str) -> psycopg.Connection:
    return psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True)


def _fingerprint(connection: psycopg.Connection) -> str:
    row = connection.execute(_FINGERPRINT).fetchone()  # type: ignore[arg-type]
    assert row is not None
    return str(row[0])


class DatabasePool:
    """Fresh databases copied from ``template`` on ``admin_dsn``, emptied and reused within this process."""

    def __init__(self, admin_dsn: str, template: str, prefix: str) -> None:
        self._admin_dsn, self._template, self._prefix = admin_dsn, template, prefix
        self._free: list[str] = []
        self._template_fingerprint: str | None = None

    def take(self) -> str:
        """The URL of an empty database at the template's schema."""
        if self._free:
            return self._free.pop()
        url = create_database(self._admin_dsn, self._prefix, self._template)
        if self._template_fingerprint is None:
            try:
                with _connect(url) as connection:
                    self._template_fingerprint = _fingerprint(connection)
            except BaseException:
                drop_database(self._admin_dsn, url)  # never left behind on the server
                raise
        return url

    def give_back(self, url: str) -> None:
        """Empty ``url`` for the next test, or drop it when its schema is no longer the template's."""
        try:
            reusable = self._empty(url)
        except psycopg.Error:
            reusable = False
        if reusable:
            self._free.append(url)
        else:
            drop_database(self._admin_dsn, url)

    def close(self) -> None:
        while self._free:
            drop_database(self._admin_dsn, self._free.pop())

    def _empty(self, url: str) -> bool:
        with _connect(url) as connection:
            # What a test left connected (a pool, a stopped stack's last worker) goes, as DROP ... WITH (FORCE) did.
            connection.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            if _fingerprint(connection) != self._template_fingerprint:
                return False
            with connection.transaction():
                # Foreign keys unchecked while every table is emptied (the order does not matter then).
                connection.execute("SET LOCAL session_replication_role = replica")
                for (table,) in connection.execute(_TABLES).fetchall():
                    connection.execute(f"DELETE FROM {table}")  # type: ignore[arg-type]
            for (sequence,) in connection.execute(_SEQUENCES).fetchall():
                connection.execute("SELECT setval(%s::regclass, 1, false)", (sequence,))
        return True
