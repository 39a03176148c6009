"""Retention's work on ``model_calls`` (``polar gc``, ``polar.records.retention``): a batch's calls deleted, or their
captured bodies emptied (``request``, ``normalized_request``, ``response`` become ``{}``) but each session's last
successful call's, which the SFT export reads and which is first stored whole (it may be a delta on the calls
being emptied, ``polar.storage.payloads``). Each returns how many calls it counts and their bodies' stored bytes."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.orm import Session as DbSession
from sqlalchemy.orm import aliased

from polar.storage.calls.read import rebuild, session_rows
from polar.storage.models import ModelCall

_BODIES = (ModelCall.request, ModelCall.normalized_request, ModelCall.response)
# An emptied call stores its (empty) bodies whole, no longer as deltas.
_EMPTIED = {**{body: {} for body in _BODIES}, ModelCall.payload_parent_id: None}


def _body_bytes(db: DbSession) -> sa.ColumnElement[Any]:
    """The stored size of a call's three bodies."""
    if db.get_bind().dialect.name == "postgresql":
        sizes = [sa.func.pg_column_size(body) for body in _BODIES]
    else:
        sizes = [sa.func.length(sa.cast(body, sa.LargeBinary)) for body in _BODIES]
    return sa.func.coalesce(sa.func.sum(sizes[0] + sizes[1] + sizes[2]), 0)


def _rows(db: DbSession, statement: sa.Executable) -> int:
    """Run a bulk DELETE / UPDATE (no ORM bookkeeping); how many rows it changed."""
    result = db.execute(statement, execution_options={"synchronize_session": False})
    return int(cast(sa.CursorResult[Any], result).rowcount)


def counted_calls(db: DbSession, session_ids: sa.ScalarSelect[Any]) -> tuple[int, int]:
    """How many calls the sessions ``session_ids`` selects hold, and their bodies' stored bytes."""
    calls, payload = db.execute(
        sa.select(sa.func.count(), _body_bytes(db)).where(ModelCall.session_id.in_(session_ids))
    ).one()
    return calls, int(payload or 0)


def delete_calls(db: DbSession, ids: Sequence[uuid.UUID]) -> tuple[int, int]:
    """Delete every call of these sessions: how many, and the bytes their bodies held."""
    payload = db.scalar(sa.select(_body_bytes(db)).where(ModelCall.session_id.in_(ids)))
    # One statement for all of a session's calls: a call's prompt parent is always a call of the same session.
    calls = _rows(db, sa.delete(ModelCall).where(ModelCall.session_id.in_(ids)))
    return calls, int(payload or 0)


def _strippable(ids: Sequence[uuid.UUID] | sa.Select[Any]) -> sa.ColumnElement[bool]:
    """Calls of these sessions that still hold a body and are not their session's last successful call."""
    later = aliased(ModelCall)
    last_ok = (
        sa.select(sa.func.max(later.seq))
        .where(later.session_id == ModelCall.session_id, later.status_code == 200)
        .scalar_subquery()
    )
    holds_body = sa.or_(*(sa.cast(body, sa.Text) != "{}" for body in _BODIES))
    return sa.and_(ModelCall.session_id.in_(ids), ModelCall.seq != sa.func.coalesce(last_ok, 0), holds_body)


def strippable_calls(db: DbSession, session_ids: sa.Select[Any]) -> tuple[int, int]:
    """How many calls of these sessions ``strip_bodies`` would empty, and their bodies' stored bytes."""
    calls, payload = db.execute(sa.select(sa.func.count(), _body_bytes(db)).where(_strippable(session_ids))).one()
    return calls, int(payload or 0)


def _keep_whole(db: DbSession, ids: Sequence[uuid.UUID]) -> None:
    """Store each session's last successful call's payloads whole: they may be deltas on the calls about to be
    emptied (``polar.storage.payloads``)."""
    kept = db.execute(
        sa.select(ModelCall.session_id, sa.func.max(ModelCall.seq).label("seq"))
        .where(ModelCall.session_id.in_(ids), ModelCall.status_code == 200)
        .group_by(ModelCall.session_id)
    ).all()
    for session_id, seq in kept:
        rows = session_rows(db, session_id, up_to_seq=seq)
        last = rows[-1]
        if last.payload_parent_id is None:
            continue
        whole = rebuild(rows, {last.id})[last.id]
        db.execute(
            sa.update(ModelCall)
            .where(ModelCall.id == last.id)
            .values(request=whole.request, normalized_request=whole.normalized_request, response=whole.response,
                    payload_parent_id=None)
        )  # fmt: skip


def strip_bodies(db: DbSession, ids: Sequence[uuid.UUID]) -> tuple[int, int]:
    """Empty the bodies of these sessions' calls but each one's last successful call (stored whole first): how many
    calls were emptied, and the bytes their bodies held."""
    _keep_whole(db, ids)
    where = _strippable(ids)
    payload = db.scalar(sa.select(_body_bytes(db)).where(where))
    emptied = _rows(db, sa.update(ModelCall).where(where).values(_EMPTIED))
    return emptied, int(payload or 0)
