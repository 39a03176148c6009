"""Moving a session on to ``postrun`` from any earlier stage: the one exit every path takes."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any

import sqlalchemy as sa

from polar.codec.json_body import storable_text
from polar.contract.dispatch import Stage
from polar.contract.states import BUFFERED, Outcome, State
from polar.lifecycle.admission import admit_after_commit
from polar.lifecycle.outbox import send_due
from polar.lifecycle.transitions import transition
from polar.services import Services
from polar.storage.storable import storable_fields, storing


def send_to_postrun(
    services: Services,
    session_id: uuid.UUID,
    expected: State | Iterable[State],
    outcome: Outcome,
    error: str | None = None,
    where: Iterable[sa.ColumnElement[bool]] = (),
    pinned: bool = True,
    **fields: Any,
) -> bool:
    """Compare-and-set the session into ``postrun`` with its outcome, queue postrun, refill the READY buffer.

    ``where`` carries the caller's lease when it holds the session; ``pinned=False`` queues postrun on the shared
    queue: for a lost node's session, finished elsewhere. ``error`` may quote the harness's output: it is stored
    made storable (``polar.storage.storable``), as is any field the database refuses."""
    expected_set = {expected} if isinstance(expected, State) else set(expected)
    error = storable_text(error) if error is not None else None

    def move(clean: bool) -> bool:
        with services.db.unit() as db:
            return transition(
                db,
                session_id,
                expected_set,
                State.POSTRUN,
                by=services,
                detail=outcome.value if not error else f"{outcome.value}: {error[:200]}",
                where=where,
                due=Stage.POSTRUN,
                pinned=pinned,
                outcome=outcome.value,
                error=error,
                **(storable_fields(fields) if clean else fields),
            )

    moved = storing(move, f"session {session_id} on to postrun")
    if moved:
        send_due(services, [session_id])
        if expected_set & BUFFERED:
            admit_after_commit(services, f"session {session_id} is on its way to postrun")
    return moved
