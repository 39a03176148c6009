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
    """How an attempt ended; postrun turns it into a terminal state, and ``polar.lifecycle.attempts`` classes it:
    the policy's doing (task), the machinery's (infrastructure), or a cancel."""

    # What the task did: the training signal.
    EXITED = "exited"  # the harness exited by itself (any exit code)
    TIMEOUT = "timeout"  # the harness's budget ran out while it ran
    # Neither: never scored, never served.
    CANCELLED = "cancelled"  # the batch was cancelled
    # What the machinery did: never a reward.
    WORKER_LOST = "worker_lost"  # the run worker stopped heartbeating (killed, its machine froze)
    NODE_LOST = "node_lost"  # every worker of the node holding the runtime is gone
    RUNTIME_FAILED = "runtime_failed"  # the runtime could not be created, reached, or disappeared
    ENGINE_FAILED = "engine_failed"  # the harness failed after the engine failed its calls
    QUEUE_TIMEOUT = "queue_timeout"  # the budget ran out before the harness started (waiting for a run slot)
    # Preparation is not the policy: the harness never started.
    PREPARE_FAILED = "prepare_failed"  # a prepare step failed (the session's runtime or the evaluator's)
    INIT_TIMEOUT = "init_timeout"  # init's budget ran out before the harness started (slow steps, a lost init)
    UNSCORABLE = "unscorable"  # the evaluator's own code failed (a bug, its runtime gone), not the work it judged
    ERROR = "error"  # Polar itself failed unexpectedly
