"""What the training exports (``polar.training.exports``) read of a batch's calls: the answer call of each session
(the last one the engine answered among its main chain's calls, ``polar.reconstruction.main_chain``), the policy
version the calls carried, the calls held across a weight update, and the stored rows the SFT rows are rebuilt
from. Which sessions an export considers is the caller's: it passes its conditions on ``sessions`` as ``where``."""

from __future__ import annotations

import uuid
from collections.abc import Collection, Sequence
from typing import Any

import sqlalchemy as sa

from polar.storage.calls.read import STORED
from polar.storage.columns import array_length, is_postgres
from polar.storage.models import ModelCall, Session, Task, Trajectory


def _of_batch(batch_id: uuid.UUID) -> sa.ColumnElement[bool]:
    """The batch's calls only: the per-session aggregates below read them through the (session_id, seq) index
    instead of grouping every call ever captured (audit F21)."""
    return ModelCall.session_id.in_(sa.select(Session.id).where(Session.batch_id == batch_id))


def _answer_call(db: Any, batch_id: uuid.UUID) -> Any:
    """Per session of the batch, the seq of its answer: the last call the engine answered with 200 among the calls
    of its trajectories marked ``main`` (``polar.reconstruction.main_chain``), never a side call. Each main
    trajectory's calls are listed from its ``call_ids`` and found by their ids."""
    if is_postgres(db):
        listed = sa.func.unnest(Trajectory.call_ids).table_valued("call_id").render_derived()
        call_id: Any = sa.cast(listed.c.call_id, sa.Uuid())
    else:  # SQLite keeps the ids as JSON strings, and a Uuid column as 32 hex digits
        listed = sa.func.json_each(Trajectory.call_ids).table_valued("value")
        call_id = sa.func.replace(listed.c.value, "-", "")
    main = (
        sa.select(call_id.label("call_id"))
        .select_from(Trajectory)
        .join(listed, sa.true())
        .where(Trajectory.main, Trajectory.session_id.in_(sa.select(Session.id).where(Session.batch_id == batch_id)))
        .subquery()
    )
    return (
        sa.select(ModelCall.session_id, sa.func.max(ModelCall.seq).label("seq"))
        .join(main, ModelCall.id == main.c.call_id)
        .where(ModelCall.status_code == 200, ~ModelCall.synthesized)
        .group_by(ModelCall.session_id)
        .subquery()
    )


def call_policy_version(batch_id: uuid.UUID) -> Any:
    """Per session of the batch, the calls' policy_version when every call carried the same one, else null (a
    subquery of ``session_id, version``)."""
    version = ModelCall.policy_version
    same = sa.and_(sa.func.count(sa.distinct(version)) == 1, sa.func.count(version) == sa.func.count())
    return (
        sa.select(ModelCall.session_id, sa.case((same, sa.func.min(version)), else_=None).label("version"))
        .where(_of_batch(batch_id))
        .group_by(ModelCall.session_id)
        .subquery()
    )


def spanning_calls(db: Any, batch_id: uuid.UUID) -> set[str]:
    """Ids of the batch's calls an engine held across a weight update (``model_calls.spans_policy_update``)."""
    query = (
        sa.select(ModelCall.id)
        .join(Session, Session.id == ModelCall.session_id)
        .where(Session.batch_id == batch_id, ModelCall.spans_policy_update)
    )
    return {str(call_id) for call_id in db.scalars(query)}


def answer_totals(db: Any, batch_id: uuid.UUID, *where: sa.ColumnElement[bool]) -> Any:
    """Of the batch's sessions matching ``where`` that have an answer call, how many, and those calls' tokens
    (prompt + completion): one ``(count, tokens)`` row."""
    last = _answer_call(db, batch_id)
    size = ModelCall.prompt_len + array_length(db, ModelCall.completion_token_ids)
    return db.execute(
        sa.select(sa.func.count(), sa.func.coalesce(sa.func.sum(size), 0))
        .select_from(Session)
        .join(last, last.c.session_id == Session.id)
        .join(ModelCall, sa.and_(ModelCall.session_id == Session.id, ModelCall.seq == last.c.seq))
        .where(*where)
    ).one()


def answer_calls(db: Any, batch_id: uuid.UUID, *where: sa.ColumnElement[bool]) -> Sequence[Any]:
    """The batch's sessions matching ``where`` that have an answer call, in task order then sample order: rows of
    ``id, task_id, sample_index, reward`` (the session's) and ``call_id, seq`` (its answer call's)."""
    last = _answer_call(db, batch_id)
    query = (
        sa.select(Session.id, Session.task_id, Session.sample_index, Session.reward, ModelCall.id.label("call_id"),
                  ModelCall.seq)
        .join(Task, Task.id == Session.task_pk)
        .join(last, last.c.session_id == Session.id)
        .join(ModelCall, sa.and_(ModelCall.session_id == Session.id, ModelCall.seq == last.c.seq))
        .where(*where)
        .order_by(Task.position, Session.sample_index)
    )  # fmt: skip
    return db.execute(query).all()


def stored_rows(db: Any, session_ids: Collection[uuid.UUID]) -> Sequence[Any]:
    """Every call of ``session_ids`` as stored (``STORED``, and ``session_id``), by session then ``seq``."""
    return db.execute(
        sa.select(*STORED, ModelCall.session_id)
        .where(ModelCall.session_id.in_(session_ids))
        .order_by(ModelCall.session_id, ModelCall.seq)
    ).all()
