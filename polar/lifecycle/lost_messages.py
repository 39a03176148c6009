"""Which queued sessions lost their stage message (a broker restart, a worker killed holding it), as opposed to
waiting their turn. A session can wait in ``ready`` for a run slot, or in ``postrun`` behind other postruns, for
as long as the sessions ahead of it take, so time alone says nothing; the evidence is:

- a stage lease that went stale (its worker died after claiming it): the lease's own heartbeat says so;
- the session was *overtaken*: a node's queues are first in, first out, so if a session that became due on the
  same node after this one's message was sent has been taken more than a stale window ago, this one's message is
  gone;
- ``ready`` while its node has an idle run slot (fewer sessions running there than the node's run slots);
- otherwise, after ``requeue_after_s`` (``init``, whose queue is shared, and the last resort for ``postrun``).

A duplicate message is harmless (the second claim finds the session taken); these rules only keep them rare.
"""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.orm import Session as DbSession
from sqlalchemy.orm import aliased

from polar.contract.dispatch import Stage
from polar.contract.states import State
from polar.storage.models import Node, Session

_STAGE_OF = {State.INIT: Stage.INIT, State.READY: Stage.READY, State.POSTRUN: Stage.POSTRUN}
# Made once: an ORM alias of a wide table builds a proxy of every column, and the reconciler asks every pass
# (making them per call was a third of a pass's CPU).
_LATER_TO_RUN = aliased(Session, name="later_to_run")
_RUNNING = aliased(Session, name="running")
_LATER_TO_POSTRUN = aliased(Session, name="later_to_postrun")


def _overtaken_in_run_queue(stale: sa.ColumnElement[datetime] | datetime) -> sa.ColumnElement[bool]:
    later = _LATER_TO_RUN
    return sa.exists().where(
        later.node == Session.node,
        later.ready_at > Session.stage_enqueued_at,
        later.run_started_at < stale,
    )


def _idle_run_slot(default_slots: int) -> sa.ColumnElement[bool]:
    running = _RUNNING
    busy = (
        sa.select(sa.func.count())
        .where(running.node == Session.node, running.state == State.RUNNING.value)
        .scalar_subquery()
    )
    slots = sa.select(Node.run_slots).where(Node.name == Session.node).scalar_subquery()
    return busy < sa.func.coalesce(slots, default_slots)


def _overtaken_in_postrun_queue(stale: sa.ColumnElement[datetime] | datetime) -> sa.ColumnElement[bool]:
    later = _LATER_TO_POSTRUN
    return sa.exists().where(
        later.node == Session.node,
        later.postrun_started_at > Session.stage_enqueued_at,
        later.finished_at < stale,
    )


def lost_messages(
    db: DbSession,
    live: sa.ColumnElement[bool],
    stale: sa.ColumnElement[datetime] | datetime,
    requeue: sa.ColumnElement[datetime] | datetime,
    run_slots: int,
) -> list[tuple[Stage, object]]:
    """``(stage, session id)`` for every session on a live node whose stage message should be sent again."""
    unclaimed = Session.heartbeat_at.is_(None)
    sent_a_while_ago = Session.stage_enqueued_at < stale
    rows = db.execute(
        sa.select(Session.id, Session.state).where(
            live,
            sa.or_(
                # init and postrun hold a lease while worked on: a stale one means its worker died.
                sa.and_(
                    Session.state.in_([State.INIT.value, State.POSTRUN.value]),
                    Session.heartbeat_at < stale,
                    sent_a_while_ago,
                ),
                sa.and_(Session.state == State.INIT.value, unclaimed, Session.stage_enqueued_at < requeue),
                sa.and_(
                    Session.state == State.READY.value,
                    sent_a_while_ago,
                    sa.or_(_overtaken_in_run_queue(stale), _idle_run_slot(run_slots)),
                ),
                sa.and_(
                    Session.state == State.POSTRUN.value,
                    unclaimed,
                    sent_a_while_ago,
                    sa.or_(_overtaken_in_postrun_queue(stale), Session.stage_enqueued_at < requeue),
                ),
            ),
        )
    ).all()
    return [(_STAGE_OF[State(r.state)], r.id) for r in rows]
