"""A connection for a statement soon to come, checked out early and its Postgres backend woken meanwhile.

A backend that has sat idle for a model call's length answers its next statement several times slower than a busy
one: on this project's machine a prepared autocommit insert took ~0.8 ms after 20 ms idle against ~0.1 ms back to
back, and ``SELECT 1`` 0.46 against 0.03 ms (docs/benchmarks.md, small calls). The virtual CPU it slept on and its
caches have gone cold. The proxy knows its insert is coming as soon as the engine's answer is read, ~1 ms before
the insert is bound, so it sends the backend an empty query then (Postgres answers it with ``EmptyQueryResponse``,
running nothing) and reads that answer just before the insert: the backend wakes while the proxy parses the answer
and builds the row.

Waking is an optimisation and never a failure: a connection that cannot be woken or drained is dropped from the pool,
and the statement takes a connection the ordinary way (``Database.autocommit``), which rides out an outage as before.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType

import psycopg
import sqlalchemy as sa
from psycopg import pq

from polar.codec.sockets import readable, writable
from polar.storage.database import Database

log = logging.getLogger(__name__)


class EarlyConnection:
    """One autocommit connection of ``db``'s pool for one coming statement: ``wake`` checks it out and wakes its
    backend, ``use`` hands it over (or a fresh one), and leaving the ``with`` block returns it if it was not used.
    Not thread-safe: the request's own thread does all three."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self._connection: sa.Connection | None = None
        self._woken = False  # wake once: an engine request retried with max_tokens fitted reads two answers

    def wake(self) -> None:
        """Check the connection out and send its backend an empty query (Postgres only; once)."""
        if self._woken or not self._db.is_postgres:
            return
        self._woken = True
        connection = None
        try:
            connection = self._db.connect_autocommit()
            _driver(connection).pgconn.send_query(b"")
        except Exception as exc:  # any failure here only loses the head start
            log.debug("could not wake a database connection early: %s", exc)
            _discard(connection)
            return
        self._connection = connection

    @contextmanager
    def use(self) -> Iterator[sa.Connection]:
        """The woken connection once its backend has answered, else one from ``Database.autocommit``; returned to
        the pool afterwards."""
        connection, self._connection = self._connection, None
        if connection is not None and not _drained(connection):
            _discard(connection)
            connection = None
        if connection is None:
            with self._db.autocommit() as fresh:
                yield fresh
            return
        with connection:
            yield connection

    def __enter__(self) -> EarlyConnection:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.release()

    def release(self) -> None:
        """Return the connection to the pool if ``use`` never took it (a failed engine call, an error)."""
        connection, self._connection = self._connection, None
        if connection is None:
            return
        if _drained(connection):
            connection.close()
        else:
            _discard(connection)


def _driver(connection: sa.Connection) -> psycopg.Connection[object]:
    return connection.connection.driver_connection  # type: ignore[return-value]


def _drained(connection: sa.Connection) -> bool:
    """Whether the empty query's answer came and the connection is idle again (waiting for it without the GIL)."""
    try:
        pgconn = _driver(connection).pgconn
        while pgconn.flush():  # the few bytes of the query normally left at once
            writable(pgconn.socket, None)
        while pgconn.is_busy():
            readable(pgconn.socket, None)
            pgconn.consume_input()
        ok = True
        while (result := pgconn.get_result()) is not None:
            ok = ok and result.status == pq.ExecStatus.EMPTY_QUERY
        if readable(pgconn.socket):  # more after the answer: the server ending it?
            pgconn.consume_input()  # raises at the connection's end
        return ok and pgconn.status == pq.ConnStatus.OK and pgconn.transaction_status == pq.TransactionStatus.IDLE
    except Exception as exc:  # a broken connection: the caller takes another
        log.debug("a woken database connection failed: %s", exc)
        return False


def _discard(connection: sa.Connection | None) -> None:
    """Drop ``connection`` from the pool (its state is unknown) and give its slot back."""
    if connection is None:
        return
    try:
        connection.invalidate()
        connection.close()
    except Exception as exc:  # it is being thrown away
        log.debug("could not discard a database connection: %s", exc)
