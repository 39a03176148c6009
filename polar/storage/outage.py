"""Riding out a database outage: a Postgres restart or failover takes seconds, and work that is already done
(a harness that finished, a call the engine answered) must not be thrown away because of it.

    ride_out(lambda: send_to_postrun(...), within_s=60)

retries the unit of work while the database cannot be reached (connection refused, connection dropped), with
growing pauses, and gives up after ``within_s`` by raising the last error. Only whole, idempotent units of work
may be retried this way (a compare-and-set, an insert that claims its own sequence number).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

import sqlalchemy as sa

from polar.errors import CaptureFailed

log = logging.getLogger(__name__)

T = TypeVar("T")

FIRST_PAUSE_S = 0.1
LONGEST_PAUSE_S = 2.0


def unreachable(exc: BaseException) -> bool:
    """True when ``exc`` says the database could not be reached or dropped the connection (not a bad query)."""
    if isinstance(exc, sa.exc.OperationalError | sa.exc.InterfaceError):
        return True
    return isinstance(exc, sa.exc.DBAPIError) and exc.connection_invalidated


def ride_out(work: Callable[[], T], within_s: float) -> T:
    """``work()``, retried while the database is unreachable, for up to ``within_s`` seconds."""
    deadline = time.monotonic() + within_s
    pause = FIRST_PAUSE_S
    while True:
        try:
            return work()
        except sa.exc.DBAPIError as exc:
            if not unreachable(exc) or time.monotonic() + pause > deadline:
                raise
            log.warning("database unreachable (%s); retrying in %.1fs", type(exc.orig).__name__, pause)
        time.sleep(pause)
        pause = min(LONGEST_PAUSE_S, pause * 2)


def ride_out_or_refuse(work: Callable[[], T], within_s: float) -> T:
    """``ride_out``, with what is left of an outage raised as ``CaptureFailed`` (the caller's 503: retry)."""
    try:
        return ride_out(work, within_s)
    except sa.exc.DBAPIError as exc:
        raise CaptureFailed(f"Polar could not reach its database: {type(exc.orig).__name__}; retry") from exc
    except sa.exc.TimeoutError as exc:  # every pooled connection busy past the pool's wait: not a DBAPIError
        raise CaptureFailed("Polar's database connections are all busy; retry") from exc
