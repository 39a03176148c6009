"""The gauges the API computes at scrape time, on a real Postgres and Redis: sessions by state (latest attempts),
active sessions and READY-buffer occupancy per node, the nodes' bounds, retried attempts, queue depths; cached
for a while; a database or broker that does not answer fails no scrape."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from pathlib import Path

import pytest
import redis
import sqlalchemy as sa

from polar.lifecycle.nodes import announce
from polar.observability import DeploymentCollector, queue_probe
from polar.observability.queues import FolderQueues
from polar.observability.registry import Exposition
from polar.services import Services
from polar.storage.database import Database
from polar.storage.models import Node, Session
from tests.prometheus import Scrape, parse
from tests.stage_calls import command_task, domain_services, submit_tasks


def queue_names(nodes: Sequence[str]) -> list[str]:
    pinned = [f"{stage}.{node}" for node in nodes for stage in ("ready", "run", "postrun")]
    return ["init", "ready", "run", "postrun", *pinned]


def scrape(collector: DeploymentCollector) -> Scrape:
    from prometheus_client import generate_latest

    return parse(generate_latest(Exposition((collector,))).decode())  # type: ignore[arg-type]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def services(database_url: str, tmp_path: Path) -> Services:
    return domain_services(database_url, tmp_path, node="node-a", ready_buffer=4, run_concurrency=2, stale_after_s=30)


def set_session(services: Services, session_id: uuid.UUID, **values: object) -> None:
    with services.db.unit() as db:
        db.execute(sa.update(Session).where(Session.id == session_id).values(**values))


def test_the_deployment_state_as_gauges(services: Services, broker_url: str) -> None:
    submit_tasks(services, command_task("a", "true", samples=6))
    with services.db.unit() as db:
        ids = list(db.scalars(sa.select(Session.id).order_by(Session.sample_index)))
    set_session(services, ids[0], state="init")  # admitted, no init worker has it yet
    set_session(services, ids[1], state="ready", node="node-a")
    set_session(services, ids[2], state="running", node="node-a")
    set_session(services, ids[3], state="completed", node="node-a")
    # A lost attempt retried as another: only the latest attempt counts among the states.
    set_session(services, ids[4], state="failed", outcome="worker_lost", outcome_class="infrastructure",
                retried_as=ids[5], node="node-a")  # fmt: skip
    announce(services)
    with services.db.unit() as db:  # a node not seen for an hour: lost
        db.execute(sa.insert(Node).values(name="node-b", ready_buffer=9, run_slots=3, seen_at=sa.func.now()
                                          - sa.text("interval '1 hour'")))  # fmt: skip
    broker = redis.Redis.from_url(broker_url)
    broker.rpush("init", b"m1", b"m2")
    broker.rpush("run.node-a", b"m3")
    broker.rpush("run.node-a\x06\x163", b"m4")  # kombu's priority queue of run.node-a
    broker.close()

    collector = DeploymentCollector(services.db, 30, queue_names, queue_probe(broker_url, "/nowhere"))
    found = scrape(collector)

    assert found.value("polar_database_up") == 1 and found.value("polar_broker_up") == 1
    assert {state: found.value("polar_sessions", state=state) for state in found.labels("polar_sessions", "state")} == {
        "pending": 1, "init": 1, "ready": 1, "running": 1, "postrun": 0, "completed": 1, "failed": 0,
        "timed_out": 0, "cancelled": 0,
    }  # fmt: skip
    assert found.value("polar_node_sessions", node="-", state="init") == 1
    assert found.value("polar_node_sessions", node="node-a", state="running") == 1
    assert found.value("polar_ready_buffer_sessions", node="node-a") == 1
    assert found.value("polar_ready_buffer_sessions", node="-") == 1
    assert found.value("polar_ready_buffer_capacity", node="node-a") == 4
    assert not found.has("polar_ready_buffer_capacity", node="node-b")  # a lost node holds no room
    assert found.value("polar_node_run_slots", node="node-a") == 2
    assert (found.value("polar_node_up", node="node-a"), found.value("polar_node_up", node="node-b")) == (1, 0)
    assert found.value("polar_attempts_retried", outcome="worker_lost") == 1
    assert found.value("polar_queue_messages", queue="init") == 2
    assert found.value("polar_queue_messages", queue="run.node-a") == 2
    assert found.value("polar_queue_messages", queue="run.node-b") == 0  # a lost node's queues are still shown
    assert found.has("polar_queue_messages", queue="postrun")


def test_scrapes_within_the_ttl_share_one_reading(services: Services) -> None:
    submit_tasks(services, command_task("a", "true"))
    clock = Clock()
    collector = DeploymentCollector(services.db, 30, queue_names, None, ttl_s=5, clock=clock)
    assert scrape(collector).value("polar_sessions", state="init") == 1  # admitted at submission
    with services.db.unit() as db:
        db.execute(sa.update(Session).values(state="cancelled"))
    clock.now = 4.9
    assert scrape(collector).value("polar_sessions", state="init") == 1
    clock.now = 5.0
    found = scrape(collector)
    assert (found.value("polar_sessions", state="init"), found.value("polar_sessions", state="cancelled")) == (0, 1)
    assert not found.has("polar_broker_up")  # no probe: the broker is not reported at all


def test_a_silent_database_or_broker_fails_no_scrape(tmp_path: Path) -> None:
    dead = Database("postgresql+psycopg://postgres@127.0.0.1:1/nothing?connect_timeout=1")
    collector = DeploymentCollector(dead, 30, queue_names, queue_probe("redis://127.0.0.1:1/0", str(tmp_path)))
    found = scrape(collector)
    assert (found.value("polar_database_up"), found.value("polar_broker_up")) == (0, 0)
    assert not found.has("polar_sessions") and not found.has("polar_queue_messages")
    dead.dispose()


def test_the_embedded_brokers_queues_are_counted_from_its_files(tmp_path: Path) -> None:
    folder = tmp_path / "broker" / "queue"
    folder.mkdir(parents=True)
    for name in ("001_a.init.msg", "002_b.init.msg", "003_c.run.node-1.msg", ".004_d.init.msg.partial", "x.txt"):
        (folder / name).write_text("{}")
    probe = queue_probe("filesystem://", str(tmp_path))
    assert isinstance(probe, FolderQueues)
    assert probe.depths(["init", "run", "run.node-1"]) == {"init": 2, "run": 0, "run.node-1": 1}
    assert queue_probe("amqp://guest@localhost//", str(tmp_path)) is None
