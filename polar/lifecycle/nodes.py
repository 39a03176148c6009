"""Worker nodes: the machines (or ``POLAR_NODE`` names) whose workers hold sessions' runtimes.

Every worker says it is alive by stamping its node's row (``seen_at``, on the database's clock, so machines'
clocks never matter) each reconciler interval, with the node's READY bound and run slots. From that:

- admission lets as many sessions into ``init`` as the live nodes' READY bounds add up to (a node with more
  cores configures more), and an init worker takes a session only while its own node has room;
- a node none of whose workers has been seen for ``stale_after_s`` is *lost*: the reconciler on a surviving
  node ends its sessions as infrastructure-lost so their next attempts run elsewhere.

A node that never registered (an API process, a test calling stage functions itself) is never judged lost.

``polar node drain NAME`` (``drain``) stops new work on a node: its READY bound no longer counts toward admission and
its init workers take no session (another node's do), while what it already holds finishes. A drained node that
holds no session is never judged lost when its workers stop: draining is how a node leaves. One still holding
sessions is judged as before, so nothing waits on a machine that is gone. ``polar node undrain`` takes it back.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session as DbSession

from polar.contract.states import State
from polar.services import Services
from polar.storage.models import Node, Session

# A session that still lives on its node (a drained node holding one of them can still be lost).
ACTIVE_STATES = [State.INIT.value, State.READY.value, State.RUNNING.value]


@dataclass(frozen=True)
class NodeInfo:
    name: str
    ready_buffer: int
    run_slots: int
    alive: bool
    drained: bool = False


def _stale_before(db: DbSession, stale_after_s: float) -> sa.ColumnElement[bool]:
    """``seen_at`` older than the window, judged by the database's clock."""
    if db.get_bind().dialect.name == "postgresql":
        return Node.seen_at < sa.func.now() - sa.func.make_interval(0, 0, 0, 0, 0, 0, stale_after_s)
    return sa.func.julianday(sa.func.current_timestamp()) - sa.func.julianday(Node.seen_at) > stale_after_s / 86400


def announce(services: Services, unless_within_s: float | None = None) -> bool:
    """Stamp this process's node as alive now, with its READY bound and run slots. With ``unless_within_s``, only
    if no process of this node stamped it in the last ``unless_within_s`` seconds: the stamp then claims the
    node's next reconciler pass, so the worker processes of one node share a single pass per interval instead of
    each running its own. True when this call stamped the row."""
    config = services.config
    values = {
        "name": config.node,
        "ready_buffer": config.ready_buffer,
        "run_slots": config.run_concurrency,
        "seen_at": sa.func.now() if services.db.is_postgres else sa.func.current_timestamp(),
    }
    dialect = postgresql if services.db.is_postgres else sqlite
    statement = dialect.insert(Node).values(**values)
    with services.db.unit() as db:
        statement = statement.on_conflict_do_update(
            index_elements=[Node.name],
            set_={name: statement.excluded[name] for name in ("ready_buffer", "run_slots", "seen_at")},
            where=None if unless_within_s is None else _stale_before(db, unless_within_s),
        )
        # RETURNING, not rowcount: the ORM session's rowcount of an upsert is -1 on psycopg.
        return db.execute(statement.returning(Node.name)).first() is not None


def nodes(db: DbSession, stale_after_s: float) -> list[NodeInfo]:
    """Every registered node and whether it is alive."""
    stale = _stale_before(db, stale_after_s)
    rows = db.execute(
        sa.select(Node.name, Node.ready_buffer, Node.run_slots, stale.label("stale"), Node.drained_at).order_by(
            Node.name
        )
    ).all()
    return [NodeInfo(r.name, r.ready_buffer, r.run_slots, not r.stale, r.drained_at is not None) for r in rows]


def lost_nodes(db: DbSession, stale_after_s: float) -> list[str]:
    """The nodes none of whose workers was seen within ``stale_after_s``, but a drained one that holds nothing."""
    gone = [node for node in nodes(db, stale_after_s) if not node.alive]
    holding: set[str | None] = set()
    if any(node.drained for node in gone):
        names = [node.name for node in gone]
        query = sa.select(Session.node).where(Session.state.in_(ACTIVE_STATES), Session.node.in_(names)).distinct()
        holding = set(db.scalars(query))
    return [node.name for node in gone if not node.drained or node.name in holding]


def drain(db: DbSession, name: str, drained: bool = True) -> bool:
    """Drain ``name`` (no new work; what runs finishes), or take it back; False when no such node registered."""
    value = sa.func.now() if drained else None
    return (
        db.execute(sa.update(Node).where(Node.name == name).values(drained_at=value).returning(Node.name)).first()
        is not None
    )


def is_drained(db: DbSession, name: str) -> bool:
    return db.scalar(sa.select(Node.drained_at.is_not(None)).where(Node.name == name)) is True


def ready_capacity(db: DbSession, stale_after_s: float, fallback: int) -> int:
    """The READY bound of the whole deployment: the sum over live nodes, or ``fallback`` (this process's own
    bound) while no node has announced itself."""
    live = [node for node in nodes(db, stale_after_s) if node.alive]
    return sum(node.ready_buffer for node in live if not node.drained) if live else fallback
