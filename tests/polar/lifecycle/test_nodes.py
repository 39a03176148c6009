"""Worker nodes on the domain functions: announcements, the READY bound per node, stages pinned to the node that
ran init, and a lost node whose sessions another node finishes and retries (two ``Services`` on one database,
each with its own node name and work root)."""

from __future__ import annotations

import os
import shutil
import time
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa

from polar.contract.dispatch import Stage
from polar.contract.task_request import Limits, RuntimeSpec
from polar.lifecycle.nodes import announce, lost_nodes, nodes, ready_capacity
from polar.runtimes import create_runtime
from polar.services import Services
from polar.stages.init import init_session
from polar.stages.reconciler import reconcile
from polar.storage.models import Node, Session, SessionEvent
from tests.stage_calls import calls_before_postrun, command_task, deliver_all, domain_services, submit_tasks

# A node is lost when none of its workers was seen for this long: far longer than any step here takes on a loaded
# machine, so a node goes stale only when a test says so (``age``).
STALE_S = 60.0


def node_services(database_url: str, root: Path, name: str, **overrides: object) -> Services:
    return domain_services(database_url, root / name, node=name, stale_after_s=STALE_S, **overrides)


@pytest.fixture
def node_a(database_url: str, tmp_path: Path) -> Services:
    return node_services(database_url, tmp_path, "a", ready_buffer=2)


@pytest.fixture
def node_b(database_url: str, tmp_path: Path) -> Services:
    return node_services(database_url, tmp_path, "b", ready_buffer=3)


def age(services: Services, node: str, seconds: int = 3600) -> None:
    """Make ``node`` look as if none of its workers had been seen for ``seconds``."""
    with services.db.unit() as db:
        db.execute(
            sa.update(Node).where(Node.name == node).values(seen_at=sa.func.now() - sa.text(f"interval '{seconds} s'"))
        )


def sessions(services: Services) -> list[Session]:
    with services.db.unit() as db:
        return list(db.scalars(sa.select(Session).order_by(Session.sample_index, Session.attempt)))


def test_announced_nodes_are_alive_until_stale(node_a: Services, node_b: Services) -> None:
    announce(node_a)
    announce(node_b)
    with node_a.db.unit() as db:
        assert [(n.name, n.ready_buffer, n.alive) for n in nodes(db, STALE_S)] == [("a", 2, True), ("b", 3, True)]
        assert ready_capacity(db, STALE_S, fallback=99) == 5
    age(node_a, "b")
    with node_a.db.unit() as db:
        assert lost_nodes(db, STALE_S) == ["b"]
        assert ready_capacity(db, STALE_S, fallback=99) == 2


def test_without_announced_nodes_admission_uses_its_own_bound(node_a: Services) -> None:
    with node_a.db.unit() as db:
        assert ready_capacity(db, STALE_S, fallback=7) == 7


def test_admission_fills_the_live_nodes_bounds(node_a: Services, node_b: Services) -> None:
    announce(node_a)
    announce(node_b)
    submit_tasks(node_a, command_task("t", "true", samples=9))
    assert [s.state for s in sessions(node_a)].count("init") == 5


def test_stages_after_init_go_to_the_node_that_ran_it(node_a: Services) -> None:
    submit_tasks(node_a, command_task("t", "true", samples=2))
    deliver_all(node_a)
    routed = node_a.dispatcher.routed  # type: ignore[attr-defined]
    assert {(stage, node) for stage, _, node in routed} == {
        (Stage.INIT, None), (Stage.READY, "a"), (Stage.RUN, "a"), (Stage.POSTRUN, "a"),
    }  # fmt: skip
    assert {s.node for s in sessions(node_a)} == {"a"}
    with node_a.db.unit() as db:
        made = db.execute(sa.select(SessionEvent.to_state, SessionEvent.node)).all()
    assert {node for _, node in made} == {"a"} and len(made) == 2 * 6


def test_a_full_node_hands_init_back(node_a: Services, node_b: Services) -> None:
    announce(node_a)
    announce(node_b)
    submit_tasks(node_b, command_task("t", "true", samples=3))
    first, second, third = (s.id for s in sessions(node_a))
    init_session(node_a, first)
    init_session(node_a, second)  # node a's bound (2) is now full: init + ready on a
    started = time.monotonic()
    init_session(node_a, third)
    assert time.monotonic() - started >= 0.4  # it waited a moment (nothing else to do) before handing back
    by_id = {s.id: s for s in sessions(node_a)}
    assert (by_id[third].state, by_id[third].node, by_id[third].heartbeat_at) == ("init", None, None)
    assert node_a.dispatcher.routed[-1] == (Stage.INIT, third, None)  # type: ignore[attr-defined]
    init_session(node_b, third)
    assert {s.id: s.node for s in sessions(node_b)}[third] == "b"


def test_a_lost_nodes_sessions_end_elsewhere_and_run_again(node_a: Services, node_b: Services, tmp_path: Path) -> None:
    announce(node_a)
    announce(node_b)
    submit_tasks(node_b, command_task("t", "true", samples=3))
    node_a.dispatcher.sent.clear()  # type: ignore[attr-defined]
    deliver_all(node_b, until=lambda stage, _: stage is Stage.RUN)  # all three prepared on b
    on_b = sessions(node_b)
    assert {(s.state, s.node) for s in on_b} == {("ready", "b")}
    assert sorted(p.name[:36] for p in (tmp_path / "b").iterdir()) == sorted(str(s.id) for s in on_b)
    with node_b.db.unit() as db:  # one of them was running when b went away
        db.execute(
            sa.update(Session).where(Session.id == on_b[0].id).values(state="running", heartbeat_at=sa.func.now())
        )
    node_b.dispatcher.sent.clear()  # type: ignore[attr-defined]

    age(node_a, "b")
    announce(node_a)
    done = reconcile(node_a)
    assert done["node_lost"] == 3
    routed = node_a.dispatcher.routed  # type: ignore[attr-defined]
    assert {(stage, node) for stage, _, node in routed if stage is Stage.POSTRUN} == {(Stage.POSTRUN, None)}
    deliver_all(node_a, until=calls_before_postrun(node_a))  # each harness that runs asks the model once

    rows = sessions(node_a)
    lost = [s for s in rows if s.attempt == 1]
    again = [s for s in rows if s.attempt == 2]
    assert {(s.state, s.outcome, s.outcome_class, s.node) for s in lost} == {
        ("failed", "node_lost", "infrastructure", "b")
    }
    assert {(s.state, s.outcome_class, s.node) for s in again} == {("completed", "task", "a")}
    # b's runtimes were out of a's reach: left, with their handles, for b to tear down.
    assert all(s.runtime_handle for s in lost)
    assert len(list((tmp_path / "b").iterdir())) == 3

    with node_b.db.unit() as db:  # b comes back long after its sessions ended
        db.execute(sa.update(Session).values(finished_at=sa.func.now() - sa.text("interval '1 hour'")))
    done = reconcile(node_b)
    assert done["torn_down"] == 3
    assert list((tmp_path / "b").iterdir()) == []


def test_the_directory_reaper_keeps_what_is_live(node_a: Services) -> None:
    submit_tasks(node_a, command_task("t", "true"))
    deliver_all(node_a, until=lambda stage, _: stage is Stage.RUN)
    (live,) = sessions(node_a)
    root = Path(node_a.config.work_root)
    orphan = root / str(uuid.uuid4())
    orphan_evaluator = root / f"{uuid.uuid4()}-evaluator"
    stranger = root / "not-a-session"
    for directory in (orphan, orphan_evaluator, stranger):
        directory.mkdir()
    an_hour_ago = time.time() - 3600
    for directory in root.iterdir():
        os.utime(directory, (an_hour_ago, an_hour_ago))
    assert reconcile(node_a)["directories_reaped"] == 2
    assert sorted(p.name[:36] for p in root.iterdir()) == sorted([str(live.id), "not-a-session"])


@pytest.mark.skipif(shutil.which("bwrap") is None or os.getuid() != 0, reason="needs bwrap and a root worker")
def test_the_directory_reaper_unmounts_a_sandboxs_filesystem(node_a: Services) -> None:
    """A lost worker's bwrap session: its directory is a filesystem of its own (polar.runtimes.session_disk),
    which the reaper unmounts before it removes the directory, image and all."""
    orphan = create_runtime(uuid.uuid4(), RuntimeSpec(backend="bwrap", limits=Limits(disk_mb=16)), node_a.config)
    root = orphan.session_dir
    assert os.path.ismount(root)
    an_hour_ago = time.time() - 3600
    os.utime(root, (an_hour_ago, an_hour_ago))
    assert reconcile(node_a)["directories_reaped"] == 1
    assert not os.path.ismount(root) and not root.exists()


def test_a_nodes_processes_share_one_reconciler_pass_per_interval(
    node_a: Services, node_b: Services, database_url: str, tmp_path: Path
) -> None:
    """Every worker process ticks the reconciler; only the one that finds its node unstamped for ``every_s`` runs
    the pass (its other processes just find the node alive), and each node runs its own."""
    sibling = node_services(database_url, tmp_path, "a", ready_buffer=2)  # another process of node a
    assert reconcile(node_a, every_s=STALE_S)  # the node's first stamp: this process runs the pass
    orphan = Path(node_a.config.work_root) / str(uuid.uuid4())
    orphan.mkdir(parents=True)
    an_hour_ago = time.time() - 3600
    os.utime(orphan, (an_hour_ago, an_hour_ago))
    assert reconcile(sibling, every_s=STALE_S) == {}  # node a ran a pass within the interval: skipped
    assert orphan.exists()
    assert reconcile(node_b, every_s=STALE_S)["directories_reaped"] == 0  # node b's own pass, in its own root
    assert orphan.exists()
    with node_a.db.unit() as db:
        assert [(n.name, n.alive) for n in nodes(db, STALE_S)] == [("a", True), ("b", True)]
    age(node_a, "a", seconds=int(STALE_S) + 1)  # the interval has passed since node a's last pass
    assert reconcile(sibling, every_s=STALE_S)["directories_reaped"] == 1
    assert not orphan.exists()
    assert reconcile(node_a, every_s=STALE_S) == {}  # and that pass is the interval's one
    assert reconcile(node_a)["directories_reaped"] == 0  # a one-off call (no interval) always runs


def test_a_drained_node_takes_no_new_work_finishes_what_it_holds_and_is_not_lost(
    node_a: Services, node_b: Services
) -> None:
    from polar.lifecycle.nodes import drain

    announce(node_a)
    announce(node_b)
    submit_tasks(node_a, command_task("t", "true", samples=9))
    first = next(s.id for s in sessions(node_a) if s.state == "init")
    init_session(node_a, first)  # node a holds one session
    with node_a.db.unit() as db:
        assert drain(db, "a") and not drain(db, "nowhere")
        assert ready_capacity(db, STALE_S, 100) == 3  # b's bound alone
        assert [(n.name, n.drained) for n in nodes(db, STALE_S)] == [("a", True), ("b", False)]
    second = next(s.id for s in sessions(node_a) if s.state == "init" and s.node is None)
    init_session(node_a, second)  # handed back: another node's init worker takes it
    assert {s.id: s.node for s in sessions(node_a)}[second] is None
    init_session(node_b, second)
    assert {s.id: s.node for s in sessions(node_b)}[second] == "b"
    age(node_a, "a")  # its workers stop while it still holds a session: judged lost, so nothing waits on it
    with node_a.db.unit() as db:
        assert lost_nodes(db, STALE_S) == ["a"]
        db.execute(sa.update(Session).where(Session.node == "a").values(state="completed"))
        assert lost_nodes(db, STALE_S) == []  # drained and holding nothing: it left, it was not lost
        assert drain(db, "a", drained=False) and lost_nodes(db, STALE_S) == ["a"]


def test_polar_node_drain_and_undrain(node_a: Services, database_url: str) -> None:
    from click.testing import CliRunner

    from polar.local.cli import main

    announce(node_a)
    runner, env = CliRunner(), {"POLAR_DATABASE_URL": database_url}
    drained = runner.invoke(main, ["node", "drain", "a"], env=env)
    assert drained.exit_code == 0 and "node a drained" in drained.output
    with node_a.db.unit() as db:
        assert [n.drained for n in nodes(db, STALE_S)] == [True]
    assert runner.invoke(main, ["node", "undrain", "a"], env=env).exit_code == 0
    missing = runner.invoke(main, ["node", "drain", "elsewhere"], env=env)
    assert missing.exit_code == 1 and "no node named 'elsewhere'" in missing.output
    with node_a.db.unit() as db:
        assert [n.drained for n in nodes(db, STALE_S)] == [False]
