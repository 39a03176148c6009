"""Gauges the API computes when it is scraped: the deployment's state as Postgres and the broker hold it.

Each scrape runs a few cheap queries (one GROUP BY over the sessions' states, the active sessions by node, the
nodes, the retried attempts through their partial index, the pauses Polar ended from the audit trail) and reads
the stage queues' lengths from the broker; the answer is kept for ``ttl_s`` so frequent scrapes (or several
Prometheus servers) cost no more. A database or broker that does not answer fails no scrape: ``polar_database_up``
/ ``polar_broker_up`` say 0 and the series that depend on it are left out.

    probe = queue_probe(config.broker_url, config.state_dir)
    collector = DeploymentCollector(db, config.stale_after_s, queue_names, probe)  # queue_names(nodes) -> [...]
    text = generate_latest(Exposition((collector,)))
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import sqlalchemy as sa
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from polar.contract.states import BUFFERED, TERMINAL, State
from polar.lifecycle.nodes import NodeInfo, nodes
from polar.observability.queues import QueueProbe
from polar.records.audit import EXPIRY_ACTOR
from polar.storage.database import Database
from polar.storage.models import AuditEvent, Batch, Session

log = logging.getLogger(__name__)

DEFAULT_TTL_S = 5.0
STATEMENT_TIMEOUT_MS = 2000
# The node label of sessions admitted into init that no init worker has taken yet (no node name can be "-").
NO_NODE = "-"
ACTIVE = tuple(s.value for s in State if s not in TERMINAL and s is not State.PENDING)


@dataclass(frozen=True)
class DatabaseState:
    sessions: dict[str, int]  # state → sessions (latest attempts)
    active: dict[tuple[str, str], int]  # (node, state) → sessions in init, ready, running or postrun
    nodes: list[NodeInfo]
    retried: dict[str, int]  # outcome of the lost attempt → attempts retried
    pauses_expired: int = 0  # weight-sync pauses Polar ended after POLAR_MAX_PAUSE (audit rows)
    halted: int = 0  # unfinished batches their circuit breaker halted (polar.stages.circuit_breaker)


@dataclass(frozen=True)
class Snapshot:
    """What one scrape reports; None where the database or the broker did not answer (or has no probe)."""

    database: DatabaseState | None
    queues: dict[str, int] | None
    broker_probed: bool


def read_database(db: Database, stale_after_s: float) -> DatabaseState:
    """The deployment's state in a few cheap queries (each bounded by a statement timeout on Postgres)."""
    with db.unit() as unit:
        if db.is_postgres:  # a scrape must never queue behind a slow query
            unit.execute(sa.text(f"SET LOCAL statement_timeout = {STATEMENT_TIMEOUT_MS}"))
        by_state = unit.execute(
            sa.select(Session.state, sa.func.count()).where(Session.retried_as.is_(None)).group_by(Session.state)
        ).all()
        active = unit.execute(
            sa.select(Session.node, Session.state, sa.func.count())
            .where(Session.state.in_(ACTIVE))
            .group_by(Session.node, Session.state)
        ).all()
        retried = unit.execute(
            sa.select(Session.outcome, sa.func.count()).where(Session.retried_as.is_not(None)).group_by(Session.outcome)
        ).all()
        known = nodes(unit, stale_after_s)
        expired = unit.scalar(
            sa.select(sa.func.count())
            .select_from(AuditEvent)
            .where(AuditEvent.actor == EXPIRY_ACTOR, AuditEvent.action == "resume")
        )
        halting = sa.and_(Batch.halted_at.is_not(None), Batch.finished_at.is_(None))
        halted = unit.scalar(sa.select(sa.func.count()).select_from(Batch).where(halting))
    return DatabaseState(
        halted=int(halted or 0),
        sessions={str(state): int(n) for state, n in by_state},
        active={(node or NO_NODE, str(state)): int(n) for node, state, n in active},
        nodes=known,
        retried={str(outcome or "unknown"): int(n) for outcome, n in retried},
        pauses_expired=int(expired or 0),
    )


class DeploymentCollector:
    """A ``prometheus_client`` collector of the deployment's state, read at scrape time and cached ``ttl_s``.

    ``queue_names`` gives the stage queues to measure, given the registered nodes' names (the pinned stages have
    one queue per node); ``probe`` reads their lengths (None: the broker is not one Polar can read)."""

    def __init__(
        self,
        db: Database,
        stale_after_s: float,
        queue_names: Callable[[Sequence[str]], Sequence[str]],
        probe: QueueProbe | None,
        ttl_s: float = DEFAULT_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.db = db
        self.stale_after_s = stale_after_s
        self.queue_names = queue_names
        self.probe = probe
        self.ttl_s = ttl_s
        self.clock = clock
        self._lock = threading.Lock()
        self._cached: tuple[float, Snapshot] | None = None

    def snapshot(self) -> Snapshot:
        """The cached snapshot, read again once it is ``ttl_s`` old."""
        with self._lock:
            now = self.clock()
            if self._cached is None or now - self._cached[0] >= self.ttl_s:
                self._cached = (now, self._read())
            return self._cached[1]

    def _read(self) -> Snapshot:
        database = None
        try:
            database = read_database(self.db, self.stale_after_s)
        except sa.exc.SQLAlchemyError as exc:
            log.warning("metrics: the database did not answer (%s)", type(exc).__name__)
        queues = None
        if self.probe is not None:
            node_names = [node.name for node in database.nodes] if database else []
            try:
                queues = self.probe.depths(list(self.queue_names(node_names)))
            except Exception as exc:  # the broker's client raises its own kinds (redis, OS errors)
                log.warning("metrics: the broker's queues could not be read (%s)", type(exc).__name__)
        return Snapshot(database, queues, self.probe is not None)

    def collect(self) -> Iterator[Metric]:
        snap = self.snapshot()
        yield _gauge(
            "polar_database_up",
            "1 when the API could read the deployment's state from the database.",
            [((), float(snap.database is not None))],
        )
        if snap.broker_probed:
            yield _gauge(
                "polar_broker_up",
                "1 when the API could read the stage queues' lengths from the broker.",
                [((), float(snap.queues is not None))],
            )
        if snap.database is not None:
            yield from _database_metrics(snap.database)
        if snap.queues is not None:
            yield _gauge(
                "polar_queue_messages",
                "Stage messages waiting in each broker queue (not yet taken).",
                [((queue,), float(n)) for queue, n in sorted(snap.queues.items())],
                ["queue"],
            )


def _gauge(
    name: str, documentation: str, samples: Sequence[tuple[tuple[str, ...], float]], labels: Sequence[str] = ()
) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, documentation, labels=list(labels))
    for values, value in samples:
        family.add_metric(list(values), value)
    return family


def _database_metrics(snap: DatabaseState) -> Iterator[Metric]:
    states = {state.value: snap.sessions.get(state.value, 0) for state in State}
    yield _gauge(
        "polar_sessions",
        "Sessions by state (each sample's latest attempt).",
        [((state,), float(n)) for state, n in states.items()],
        ["state"],
    )
    yield _gauge(
        "polar_node_sessions",
        "Sessions in init, ready, running or postrun, by node and state "
        '(node "-": admitted, not yet taken by an init worker).',
        [((node, state), float(n)) for (node, state), n in sorted(snap.active.items())],
        ["node", "state"],
    )
    buffered = {state.value for state in BUFFERED}
    occupancy: dict[str, int] = {node.name: 0 for node in snap.nodes if node.alive}
    for (node, state), n in snap.active.items():
        if state in buffered:
            occupancy[node] = occupancy.get(node, 0) + n
    yield _gauge(
        "polar_ready_buffer_sessions",
        "Sessions holding a READY-buffer slot (init or ready), by node.",
        [((node,), float(n)) for node, n in sorted(occupancy.items())],
        ["node"],
    )
    yield _gauge(
        "polar_ready_buffer_capacity",
        "The READY bound of each live node (POLAR_READY_BUFFER there).",
        [((n.name,), float(n.ready_buffer)) for n in snap.nodes if n.alive],
        ["node"],
    )
    yield _gauge(
        "polar_node_run_slots",
        "The run slots each live node announced (POLAR_RUN_CONCURRENCY there).",
        [((n.name,), float(n.run_slots)) for n in snap.nodes if n.alive],
        ["node"],
    )
    yield _gauge(
        "polar_node_up",
        "1 for a node whose workers were seen within POLAR_STALE_AFTER, 0 for a lost one.",
        [((n.name,), float(n.alive)) for n in snap.nodes],
        ["node"],
    )
    yield _gauge(
        "polar_node_drained",
        "1 for a node drained with polar node drain (no new work; what it holds finishes).",
        [((n.name,), float(n.drained)) for n in snap.nodes],
        ["node"],
    )
    yield _gauge(
        "polar_attempts_retried",
        "Attempts lost to the infrastructure and retried, by how they were lost "
        "(stored attempts: polar gc forgets them with their batches).",
        [((outcome,), float(n)) for outcome, n in sorted(snap.retried.items())],
        ["outcome"],
    )
    expired = CounterMetricFamily(
        "polar_pauses_expired_total",
        "Weight-sync pauses Polar ended because they outlasted POLAR_MAX_PAUSE (a trainer that died paused?), "
        "counted from the audit trail.",
    )
    expired.add_metric([], float(snap.pauses_expired))
    yield expired
    yield _gauge(
        "polar_batches_halted",
        "Unfinished batches that stopped admitting after max_consecutive_infra_losses attempts in a row were lost to "
        "the infrastructure (their halted_reason says which).",
        [((), float(snap.halted))],
    )
