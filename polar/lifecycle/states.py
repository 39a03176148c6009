"""Session states and the transitions allowed between them (DESIGN.md §2)."""

from __future__ import annotations

from enum import StrEnum


class State(StrEnum):
    PENDING = "pending"
    INIT = "init"
    READY = "ready"
    RUNNING = "running"
    POSTRUN = "postrun"
    COMPLETED = "completed"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"


TERMINAL: frozenset[State] = frozenset({State.COMPLETED, State.FAILED, State.TIMED_OUT, State.CANCELLED})

# Sessions that hold a slot of the READY buffer: admitted and prepared, not yet running.
BUFFERED: frozenset[State] = frozenset({State.INIT, State.READY})

ALLOWED: dict[State, frozenset[State]] = {
    State.PENDING: frozenset({State.INIT, State.CANCELLED}),
    State.INIT: frozenset({State.READY, State.POSTRUN, State.CANCELLED}),
    State.READY: frozenset({State.RUNNING, State.POSTRUN, State.CANCELLED}),
    State.RUNNING: frozenset({State.POSTRUN}),
    State.POSTRUN: TERMINAL,
}


class Outcome(StrEnum):
    """How the harness run ended; postrun turns it into a terminal state."""

    EXITED = "exited"
    TIMEOUT = "timeout"
    WORKER_LOST = "worker_lost"
    ERROR = "error"
    CANCELLED = "cancelled"
