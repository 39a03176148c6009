"""Fault injection over a whole deployment: a batch on two worker nodes under one of two fault schedules.

- ``short``: Redis, Postgres and the engine restart, a worker of every stage is SIGKILLed and restarted, and one
  whole node is killed (and comes back later);
- ``long``: three outages of ``outage_s`` each, spaced apart: the engine stopped, model calls paused for a weight
  sync in ``reject`` mode, and Postgres stopped.

The short schedule also holds a probe of attribution: one more task, of one sample, whose harness makes a call, waits
for a weight-sync pause (``reject``) that refuses its next call, rides it out, gets every answer and then exits 1 by
itself. It recovered from the pause, so its failure is its own: scored (0.0, a task outcome) on the attempt that met
the pause, never redrawn.

Afterwards, what must hold: every session terminal, every answer a harness received in Postgres, no duplicate
trajectories, every sample ended with exactly one scored attempt (a task outcome with a reward), no task outcome
that is a failure (the chaos harness always succeeds when the infrastructure lets it: a failure is a fault scored
as the policy's), no attempt lost to the infrastructure with a reward, and those attempts nowhere in the feed or
the exports. ``tests/e2e/test_chaos.py`` and ``tests/e2e/test_long_outages.py`` assert it; ``bench/chaos.py``
prints the figures.
"""

from __future__ import annotations

import functools
import json
import os
import random
import signal
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import sqlalchemy as sa

from polar.client import PolarClient
from polar.contract.dispatch import Stage
from polar.contract.states import TERMINAL
from polar.local.launcher import NodeSpec, PoolLayout, Stack, free_port, pipeline_env, pipeline_specs
from polar.storage.database import Database
from polar.storage.migration import upgrade
from tests.private_services import PrivatePostgres, PrivateRedis

REPO = Path(__file__).resolve().parents[1]
NODES = ("node-a", "node-b")
LOST_NODE = "node-b"


@dataclass(frozen=True)
class ChaosPlan:
    tasks: int = 50
    samples: int = 4  # tasks x samples sessions (200 by default)
    calls: int = 3  # model calls per session
    tool_s: float = 0.5  # harness "tool time" between calls
    run_concurrency: int = 4  # run slots per node
    max_attempts: int = 6
    stale_after_s: float = 5.0
    seed: int = 0
    faults: bool = True  # False: the same batch undisturbed, for comparison
    schedule: Literal["short", "long"] = "short"
    outage_s: float = 60.0  # the long schedule: how long each outage lasts
    # Each node's worker pools: the short schedule SIGKILLs a worker of every stage, so it needs one per stage; the
    # long one kills no worker, and two pools per node serve it as well.
    layout: PoolLayout = "per-stage"

    def __post_init__(self) -> None:
        if self.faults and self.schedule == "short" and self.layout != "per-stage":
            raise ValueError("the short schedule kills a worker of every stage: it needs the per-stage layout")

    @property
    def pause_probe(self) -> bool:
        """Whether the batch holds the attribution probe's task (the short schedule's, with faults)."""
        return self.faults and self.schedule == "short"

    @property
    def sessions(self) -> int:
        return self.tasks * self.samples + (1 if self.pause_probe else 0)


@dataclass
class ChaosReport:
    plan: ChaosPlan
    faults: list[tuple[float, str]] = field(default_factory=list)
    wall_s: float = 0.0
    sessions: int = 0  # attempts, every one a session row
    samples: int = 0
    task_outcomes: int = 0
    scored_failures: int = 0  # settled task outcomes that failed: a fault scored as the policy's
    recovered_and_scored: int = 0  # the probe: refused by a pause, recovered, failed by itself, scored as a task
    retried: Counter[str] = field(default_factory=Counter)  # lost attempts by outcome
    refusals: Counter[str] = field(default_factory=Counter)  # calls the proxy refused, by reason (call_refusals)
    out_of_attempts: int = 0
    states: Counter[str] = field(default_factory=Counter)  # of each sample's settled attempt
    received: int = 0
    captured_answers: int = 0
    undelivered: int = 0  # answers captured whose harness was gone before they reached it (out of trajectories)
    feed_items: int = 0
    export_rows: int = 0
    reaped_on_return: bool = False
    unplanned_restarts: list[str] = field(default_factory=list)  # processes that exited on their own
    violations: list[str] = field(default_factory=list)

    def figures(self) -> list[tuple[str, str]]:
        lost = sum(self.retried.values()) + self.out_of_attempts
        by_outcome = ", ".join(f"{outcome} {n}" for outcome, n in self.retried.most_common())
        return [
            ("sessions (attempts) / samples", f"{self.sessions} / {self.samples}"),
            ("faults injected", str(len(self.faults))),
            ("batch wall time", f"{self.wall_s:.1f} s"),
            ("samples ending with a task outcome", f"{self.task_outcomes} / {self.samples}"),
            ("task outcomes that failed (faults scored)", str(self.scored_failures)),
            ("recovered from a pause, then failed by itself: scored", self._probe()),
            ("attempts lost to the infrastructure", f"{lost} ({by_outcome})"),
            ("samples out of attempts", str(self.out_of_attempts)),
            ("refused calls recorded", ", ".join(f"{k} {v}" for k, v in sorted(self.refusals.items())) or "none"),
            ("final states", ", ".join(f"{k} {v}" for k, v in sorted(self.states.items()))),
            ("answers harnesses received / found in Postgres", f"{self.received} / {self.received - self._missing()}"),
            ("answers captured after their harness was gone (undelivered)", str(self.undelivered)),
            ("feed items / RL export rows", f"{self.feed_items} / {self.export_rows}"),
            ("lost node's directories reaped on return", self._reaped()),
            ("processes that exited on their own (restarted)", ", ".join(self.unplanned_restarts) or "none"),
            ("violations", str(len(self.violations))),
        ]  # fmt: skip

    def _probe(self) -> str:
        return str(self.recovered_and_scored) if self.plan.pause_probe else "n/a (no probe in this schedule)"

    def _reaped(self) -> str:
        if not self.plan.faults or self.plan.schedule != "short":
            return "n/a (no node was lost)"
        return "yes" if self.reaped_on_return else "no"

    def _missing(self) -> int:
        return sum(1 for v in self.violations if v.startswith("received but not captured"))


class _Deployment:
    """Private Postgres and Redis, the engine, API and proxy, and a set of stage workers per node."""

    def __init__(self, plan: ChaosPlan, workdir: Path) -> None:
        self.plan = plan
        self.workdir = workdir
        self.received_log = workdir / "received.jsonl"
        self.signals = workdir / "probe-signals"  # the probe harness's rendezvous with its pause
        self.signals.mkdir(parents=True, exist_ok=True)
        self.postgres = PrivatePostgres()
        self.redis = PrivateRedis()
        self.nodes = {name: NodeSpec(name, workdir / name / "sessions") for name in NODES}
        self.stack: Stack | None = None

    def start(self) -> None:
        self.postgres.start()
        self.redis.start()
        database_url = self.postgres.create_database("polar")
        upgrade(database_url)
        self.db = Database(database_url)
        ports = {"engine": free_port(), "api": free_port(), "proxy": free_port()}
        self.engine_port = ports["engine"]
        env = {
            **pipeline_env(database_url, self.redis.url, ports, self.workdir / "state", self.plan.run_concurrency),
            "POLAR_HEARTBEAT_INTERVAL": "0.5",
            "POLAR_STALE_AFTER": str(self.plan.stale_after_s),
            "POLAR_RECONCILE_INTERVAL": "1",
            "POLAR_REQUEUE_AFTER": "60",
            "POLAR_VISIBILITY_TIMEOUT": "60",
            "POLAR_PLUGIN_MODULES": "tests.e2e",  # the chaos agent is named by import path
        }
        if self.plan.schedule == "long":
            # The proxy and the workers ride out an unreachable database for as long as an outage lasts (at the
            # default 60 s, the product's own default), so the Postgres outage, with its restart, outlasts what
            # they ride out at any ``outage_s``.
            env["POLAR_DB_OUTAGE"] = f"{self.plan.outage_s:g}"
        engine_args = ["--policy-config", json.dumps({"tokens": 16}), "--log", str(self.workdir / "engine.jsonl")]
        nodes, layout = list(self.nodes.values()), self.plan.layout
        specs = pipeline_specs(ports, "echo", engine_args, self.plan.run_concurrency, nodes=nodes, layout=layout)
        self.stack = Stack(specs, env, self.workdir / "logs")
        self.stack.start(timeout_s=120)
        # As in production, a service manager restarts what exits (a Celery worker may, on a broker restart).
        self.stack.supervise()
        self.client = PolarClient(env["POLAR_API_URL"], env["POLAR_API_TOKEN"])

    def close(self) -> None:
        if self.stack is not None:
            self.stack.stop()
            self.client.close()
            self.db.dispose()
        self.redis.close()
        self.postgres.close()

    def sql(self, query: str, **params: Any) -> list[Any]:
        with self.db.engine.connect() as connection:
            return list(connection.execute(sa.text(query), params).all())


PROBE_TASK = "chaos-pause-probe"


def _task(index: int, plan: ChaosPlan, received_log: Path) -> dict[str, Any]:
    return {
        "task_id": f"chaos-{index:03d}",
        "instruction": f"Task {index}: say something.",
        "num_samples": plan.samples,
        "timeout_seconds": 300,
        "max_attempts": plan.max_attempts,
        "reconstruction": "prefix_merging",
        "harness": {
            "name": "python",
            "command": "tests.e2e.agents.chaos:run",
            "env": {
                "PYTHONPATH": str(REPO),
                "CHAOS_RECEIVED_LOG": str(received_log),
                "CHAOS_CALLS": str(plan.calls),
                "CHAOS_TOOL_S": str(plan.tool_s),
            },
        },
    }


def _probe_task(plan: ChaosPlan, received_log: Path, signals: Path) -> dict[str, Any]:
    """The attribution probe: it waits after its first answer for the pause (``_Faults.pause_probe``), is refused,
    rides the pause out, and exits 1 once it has every answer."""
    task = _task(0, plan, received_log)
    task["harness"]["env"].update({"CHAOS_FAIL_IF_REFUSED": "1", "CHAOS_PAUSE_SIGNALS": str(signals)})
    return {**task, "task_id": PROBE_TASK, "num_samples": 1}


class _Faults:
    """The fault schedule, run in a thread from the moment the batch is submitted."""

    def __init__(self, deployment: _Deployment, report: ChaosReport, rng: random.Random) -> None:
        self.d = deployment
        self.report = report
        self.rng = rng
        self.started = time.monotonic()
        self.down: set[str] = set()
        stale = deployment.plan.stale_after_s
        worker_kills: list[tuple[float, Callable[[], None]]] = [
            (2.0 + 2 * i, lambda stage=stage: self.kill_worker(stage)) for i, stage in enumerate(Stage)
        ]
        self.schedule: list[tuple[float, Callable[[], None]]] = [
            *worker_kills,
            (11.0, self.restart_redis),
            (17.0, self.restart_postgres),
            (23.0, self.restart_engine),
            (28.0, self.kill_node),
            (28.0 + 3 * stale + 10.0, self.revive_node),
            (30.0, lambda: self.kill_worker(Stage.RUN)),
        ]
        if deployment.plan.schedule == "long":
            gap = deployment.plan.outage_s + 15.0  # each outage over and its effects settling before the next
            self.schedule = [
                (5.0, self.stop_engine),
                (5.0 + gap, self.pause_calls),
                (5.0 + 2 * gap, self.stop_postgres),
            ]
        self.schedule.sort(key=lambda item: item[0])
        if not deployment.plan.faults:
            self.schedule = []
        self.thread = threading.Thread(target=self._run, name="chaos", daemon=True)
        self.done = threading.Event()

    def _note(self, what: str) -> None:
        self.report.faults.append((round(time.monotonic() - self.started, 1), what))

    def _run(self) -> None:
        # The probe's pause waits for its harness, on a thread of its own: the schedule's faults keep their times.
        probe = threading.Thread(target=self._apply, args=(self.pause_probe,), name="chaos-probe", daemon=True)
        try:
            if self.d.plan.pause_probe:
                probe.start()
            for at, fault in self.schedule:
                time.sleep(max(0.0, at - (time.monotonic() - self.started)))
                self._apply(fault)
            if probe.is_alive():
                probe.join()
        finally:
            self.done.set()

    def _apply(self, fault: Callable[[], None]) -> None:
        try:
            fault()
        except Exception as exc:  # the run goes on; the report says the fault did not go as planned
            self.report.violations.append(f"fault {getattr(fault, '__name__', fault)} failed: {exc!r}")

    @property
    def stack(self) -> Stack:
        assert self.d.stack is not None
        return self.d.stack

    def _kill(self, name: str) -> None:
        try:
            self.stack.signal(name, signal.SIGKILL)
        except ProcessLookupError:  # it had exited on its own (a worker may, on a broker restart): down already
            pass
        self.stack.processes[name].wait()

    def kill_worker(self, stage: Stage) -> None:
        """SIGKILL one worker of ``stage`` on a random live node; the supervisor starts it again."""
        node = self.rng.choice([n for n in NODES if n not in self.down])
        name = f"{node}-worker-{stage.value}"
        self._kill(name)
        self._note(f"SIGKILL {name}")

    def restart_redis(self) -> None:
        self.d.redis.restart()
        self._note("Redis killed and restarted (AOF)")

    def restart_postgres(self) -> None:
        self.d.postgres.restart()
        self._note("Postgres stopped (immediate) and restarted")

    def restart_engine(self) -> None:
        self._kill("engine")
        self._note("engine killed")
        self.stack.wait_healthy(60, names=["engine"])  # the supervisor starts it again
        self._note("engine back")

    def stop_engine(self) -> None:
        """The engine down for ``outage_s`` (the supervisor leaves it down until released)."""
        self.stack.hold("engine")
        self._kill("engine")
        # Its port stays taken meanwhile, bound but not listening (calls are refused as by a dead engine): a minute
        # free would let another process, or a client connecting to itself, take it, and the engine never return.
        placeholder = socket.socket()
        placeholder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        placeholder.bind(("127.0.0.1", self.d.engine_port))
        self._note(f"engine stopped for {self.d.plan.outage_s:g}s")
        time.sleep(self.d.plan.outage_s)
        placeholder.close()
        self.stack.release("engine")
        self.stack.wait_healthy(120, names=["engine"])
        self._note("engine back")

    def pause_calls(self) -> None:
        """A weight sync: model calls paused in ``reject`` mode (429s) for ``outage_s``, once a harness is in the
        middle of its session. A pause that lands between harnesses refuses nothing (the run workers wait it out
        before they start the next), and after the engine's outage every run slot restarts at once, so on a quick
        machine they all end together: the pause waits (up to a minute) for a harness with two calls still to make."""
        mid_session = "SELECT count(*) FROM sessions WHERE state = 'running' AND num_calls BETWEEN 1 AND :most"
        deadline = time.monotonic() + 60.0
        while self.d.sql(mid_session, most=self.d.plan.calls - 2)[0][0] == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        self.d.client.pause(mode="reject")
        self._note(f"model calls paused (reject) for {self.d.plan.outage_s:g}s")
        time.sleep(self.d.plan.outage_s)
        self.d.client.resume()
        self._note("model calls resumed")

    def pause_probe(self) -> None:
        """The probe's pause: once its harness has an answer and waits (``waiting-<session>``), calls are paused
        (``reject``), the harness let go (``go-<session>``) and, once its next call was refused, resumed. An attempt
        of the probe lost to another fault meanwhile is retried: its next attempt waits, and meets a pause, likewise."""
        signals = self.d.signals
        deadline = time.monotonic() + 240.0
        while time.monotonic() < deadline:
            waiting = [p.name.removeprefix("waiting-") for p in signals.glob("waiting-*")]
            session = next((s for s in waiting if not (signals / f"go-{s}").exists()), None)
            if session is None:
                if _through_faults(lambda: self.d.sql(_PROBE_SCORED), deadline):
                    return
                time.sleep(0.2)
                continue
            _through_faults(lambda: self.d.client.pause(mode="reject"), deadline)
            self._note(f"model calls paused (reject) for the probe's session {session[:8]}")
            try:
                (signals / f"go-{session}").touch()
                # Its attempt may be lost to another fault before it calls again (its node killed): then no refusal
                # comes, the pause ends with the attempt (or after a minute), and the retried attempt waits for a
                # pause of its own.
                refused_by = time.monotonic() + 60.0
                ask = functools.partial(self.d.sql, _PROBE_MET_PAUSE, session=session)
                while time.monotonic() < refused_by and not _through_faults(ask, refused_by):
                    time.sleep(0.1)
            finally:
                _through_faults(lambda: self.d.client.resume(), deadline + 60.0)
                self._note("model calls resumed")
        raise TimeoutError("the probe's session was never scored after a pause")

    def stop_postgres(self) -> None:
        """Postgres stopped (as in a crash) for ``outage_s``, then started on the same data."""
        self.d.postgres.stop("immediate")
        self._note(f"Postgres stopped for {self.d.plan.outage_s:g}s")
        time.sleep(self.d.plan.outage_s)
        self.d.postgres.start()
        self._note("Postgres back")

    def kill_node(self) -> None:
        """The whole node goes away: its four workers and every process running in its sessions."""
        self.down.add(LOST_NODE)
        for stage in Stage:
            self.stack.hold(f"{LOST_NODE}-worker-{stage.value}")
            self._kill(f"{LOST_NODE}-worker-{stage.value}")
        root = str(self.d.nodes[LOST_NODE].work_root)
        for pid in _processes_under(root):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self._note(f"node {LOST_NODE} killed (workers and harnesses)")

    def revive_node(self) -> None:
        for stage in Stage:
            self.stack.release(f"{LOST_NODE}-worker-{stage.value}")  # the supervisor starts them again
        self.down.discard(LOST_NODE)
        self._note(f"node {LOST_NODE} back")


def _through_faults(work: Callable[[], Any], deadline: float) -> Any:
    """``work``, tried again while the schedule's faults make Postgres or the API fail it (until ``deadline``)."""
    while True:
        try:
            return work()
        except Exception:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.5)


_PROBE_REFUSED = "SELECT 1 FROM call_refusals WHERE session_id = CAST(:session AS uuid) AND reason = 'paused'"
# The probe's attempt was refused by its pause, or is over without it (lost to another fault: then it is retried).
_PROBE_MET_PAUSE = (
    "SELECT 1 FROM sessions WHERE id = CAST(:session AS uuid) "
    f"AND (state IN ({', '.join(sorted(repr(state.value) for state in TERMINAL))}) OR EXISTS ({_PROBE_REFUSED}))"
)
_PROBE_SCORED = f"SELECT 1 FROM sessions WHERE task_id = '{PROBE_TASK}' AND feed_seq IS NOT NULL"


def _unplanned(restarts: list[tuple[str, int | None]]) -> list[str]:
    """The supervisor's restarts of processes that exited on their own (the schedule's kills are all SIGKILL)."""
    return [f"{name} (exit {status})" for name, status in restarts if status != -signal.SIGKILL]


def _processes_under(root: str) -> list[int]:
    """Processes whose working directory is inside ``root`` (a node's sessions)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.readlink(f"/proc/{entry}/cwd").startswith(root):
                    found.append(int(entry))
            except OSError:
                continue
    return found


def run_chaos(plan: ChaosPlan, workdir: Path, log: Callable[[str], None] = print) -> ChaosReport:
    """Run the plan's batch under the fault schedule and check what must hold; returns the report (violations
    listed, never raised)."""
    report = ChaosReport(plan)
    deployment = _Deployment(plan, workdir)
    try:
        deployment.start()
        log(f"deployment up: {plan.sessions} sessions on {len(NODES)} nodes")
        faults = _Faults(deployment, report, random.Random(plan.seed))
        started = time.monotonic()
        tasks = [_task(i, plan, deployment.received_log) for i in range(plan.tasks)]
        if plan.pause_probe:  # first, so that its pause comes while the schedule's faults do
            tasks.insert(0, _probe_task(plan, deployment.received_log, deployment.signals))
        batch = deployment.client.submit({"name": "chaos", "tasks": tasks})
        faults.thread.start()
        final = _wait_finished(deployment, batch["batch_id"], faults, timeout_s=900)
        report.wall_s = time.monotonic() - started
        assert deployment.stack is not None
        report.unplanned_restarts = _unplanned(deployment.stack.restarts)
        for at, what in report.faults:
            log(f"  {at:6.1f}s  {what}")
        log(f"batch finished in {report.wall_s:.1f}s: {final['counts']} attempts {final['attempts']}")
        _check(deployment, batch["batch_id"], report)
    finally:
        deployment.close()
    return report


def _wait_finished(deployment: _Deployment, batch_id: str, faults: _Faults, timeout_s: float) -> dict[str, Any]:
    """The batch's final status once it has finished and every fault has been applied (the lost node back)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            status = deployment.client.batch(batch_id)
        except Exception:  # the API may be answering 5xx while Postgres restarts
            status = {"status": "unknown"}
        if status["status"] == "finished" and faults.done.is_set():
            return status
        time.sleep(0.5)
    raise TimeoutError(f"batch {batch_id} not finished after {timeout_s}s")


def _check_probe(d: _Deployment, final: Any, v: list[str], report: ChaosReport) -> None:
    """The probe's settled attempt: refused by the pause, every answer received, failed by itself: scored 0.0."""
    refused = d.sql(_PROBE_REFUSED, session=final.id)
    if refused and (final.state, final.outcome, final.reward) == ("failed", "exited", 0.0):
        report.recovered_and_scored += 1
    else:
        ended = f"{final.state}, {final.outcome}, reward {final.reward}"
        v.append(f"the probe's attempt {final.attempt}: refused {bool(refused)}, ended {ended} (a harness that "
                 "recovered from a pause is scored)")  # fmt: skip


def _check(d: _Deployment, batch_id: str, report: ChaosReport) -> None:
    v = report.violations
    rows = d.sql(
        "SELECT id::text AS id, task_id, sample_index, attempt, state, outcome, outcome_class, retried_as, feed_seq, "
        "reward FROM sessions"
    )
    report.sessions = len(rows)
    open_sessions = [r.id for r in rows if r.state not in {"completed", "failed", "timed_out", "cancelled"}]
    v += [f"session not terminal: {s}" for s in open_sessions]
    samples: dict[tuple[str, int], list[Any]] = {}
    for row in rows:
        samples.setdefault((row.task_id, row.sample_index), []).append(row)
    report.samples = len(samples)
    if report.samples != d.plan.sessions:
        v.append(f"{report.samples} samples, expected {d.plan.sessions}")
    for key, attempts in samples.items():
        settled = [a for a in attempts if a.feed_seq is not None]
        if len(settled) != 1:
            v.append(f"sample {key}: {len(settled)} settled attempts")
            continue
        final = settled[0]
        report.states[final.state] += 1
        if final.outcome_class == "task":
            report.task_outcomes += 1
            if final.reward is None:
                v.append(f"sample {key}: its task outcome has no reward ({final.state}, {final.outcome})")
            if key[0] == PROBE_TASK:
                _check_probe(d, final, v, report)
            elif final.state != "completed" or final.reward != 1.0:  # the harness succeeds unless a fault hit it
                report.scored_failures += 1
                v.append(f"sample {key}: a fault scored as the policy's ({final.state}, {final.outcome}, "
                         f"reward {final.reward})")  # fmt: skip
        else:
            report.out_of_attempts += 1
            v.append(f"sample {key} ended without a task outcome ({final.outcome})")
        for lost in attempts:
            if lost.outcome_class == "infrastructure" and lost.reward is not None:
                v.append(f"sample {key}: attempt {lost.attempt}, lost to the infrastructure, has reward {lost.reward}")
            if lost is not final:
                report.retried[lost.outcome] += 1
                if lost.outcome_class != "infrastructure" or lost.retried_as is None:
                    v.append(f"sample {key}: attempt {lost.attempt} neither settled nor retried")

    if d.plan.pause_probe and report.recovered_and_scored != 1:
        v.append("the probe: no session refused by a pause, recovered and failed by itself was scored")

    report.refusals.update({r.reason: int(r.n) for r in d.sql(
        "SELECT reason, sum(count) AS n FROM call_refusals GROUP BY reason"
    )})  # fmt: skip

    # Every answer a harness received is in Postgres, token for token.
    received = [json.loads(line) for line in d.received_log.read_text().splitlines()] if d.received_log.exists() else []
    report.received = len(received)
    captured = {
        (r.session_id, r.response_id): r
        for r in d.sql(
            "SELECT session_id::text AS session_id, response ->> 'id' AS response_id, completion_token_ids, delivered "
            "FROM model_calls_full WHERE status_code = 200"
        )
    }
    report.captured_answers = len(captured)
    report.undelivered = sum(1 for r in captured.values() if not r.delivered)
    for record in received:
        call = captured.get((record["session_id"], record["response_id"]))
        if call is None or (record["token_ids"] is not None and list(call.completion_token_ids) != record["token_ids"]):
            v.append(f"received but not captured: {record['session_id']} {record['response_id']}")
        elif not call.delivered:
            v.append(f"received but marked undelivered: {record['session_id']} {record['response_id']}")

    # No duplicate trajectories: every answered call of a session that reached its harness in exactly one of its
    # trajectories (an answer captured after a killed harness was gone is marked undelivered and left out).
    calls: dict[str, set[str]] = {}
    for r in d.sql(
        "SELECT session_id::text AS s, id::text AS c FROM model_calls "
        "WHERE status_code = 200 AND delivered AND NOT synthesized"
    ):
        calls.setdefault(r.s, set()).add(r.c)
    merged: dict[str, list[str]] = {}
    for r in d.sql("SELECT session_id::text AS s, call_ids FROM trajectories"):
        merged.setdefault(r.s, []).extend(r.call_ids)
    for row in rows:
        in_trajectories, answered = merged.get(row.id, []), calls.get(row.id, set())
        if len(in_trajectories) != len(set(in_trajectories)) or set(in_trajectories) != answered:
            v.append(f"session {row.id} ({row.state}, {row.outcome}): its trajectories hold "
                     f"{len(in_trajectories)} calls ({len(set(in_trajectories))} distinct), "
                     f"{len(answered - set(in_trajectories))} delivered calls missing, "
                     f"{len(set(in_trajectories) - answered)} not delivered calls")  # fmt: skip

    # Lost attempts are nowhere in the feed or the exports; every task outcome is, once.
    keep = {r.id for r in rows if r.outcome_class == "task" and r.id in merged}
    fed: Counter[str] = Counter()
    cursor = 0
    while True:
        page = d.client.feed(batch_id, after=cursor, limit=500, groups=True)
        fed.update(item["session_id"] for item in page["items"])
        if page["next_cursor"] == cursor:
            break
        cursor = page["next_cursor"]
    report.feed_items = sum(fed.values())
    if set(fed) != keep:
        v.append(f"feed sessions differ: {len(set(fed) - keep)} extra, {len(keep - set(fed))} missing")
    export = d.workdir / "rl.jsonl"
    d.client.download(batch_id, "rl", "jsonl", None, export)
    exported = [json.loads(line)["session_id"] for line in export.read_text().splitlines()]
    report.export_rows = len(exported)
    if set(exported) != keep or Counter(exported) != fed:
        v.append("RL export differs from the task outcomes' trajectories")

    # The lost node, back, tears down what it left (directories of sessions that ended meanwhile).
    if not d.plan.faults or d.plan.schedule != "short":
        return
    root = d.nodes[LOST_NODE].work_root
    assert root is not None
    deadline = time.monotonic() + 4 * d.plan.stale_after_s + 20
    while time.monotonic() < deadline and root.exists() and any(root.iterdir()):
        time.sleep(0.5)
    report.reaped_on_return = not (root.exists() and any(root.iterdir()))
    if not report.reaped_on_return:
        v.append(f"{LOST_NODE} kept {len(list(root.iterdir()))} session directories")
