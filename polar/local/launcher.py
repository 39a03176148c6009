"""Starting Polar's processes on one machine: the reference engine, the API and proxy under gunicorn, and the
Celery worker pools of the stage queues (``POOL_LAYOUTS``). ``polar up`` / ``polar demo`` use it with embedded
defaults; the test suite uses it against Postgres and Redis. It runs commands; it never imports the web or worker
frameworks.
"""

from __future__ import annotations

import contextlib
import os
import random
import secrets
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import httpx

from polar.codec import instance
from polar.contract.dispatch import Stage

PYTHON = sys.executable


# Ports this process has handed out, not yet necessarily bound by whoever asked.
_HANDED_OUT: set[int] = set()
_RANDOM = random.SystemRandom()


def _ephemeral_range() -> tuple[int, int]:
    """The kernel's range for ports it picks itself (bind to 0, a client's connect)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 49152, 65535  # the IANA range, which BSDs and macOS use


def port_is_free(port: int) -> bool:
    """Whether a server could bind ``port`` on loopback now."""
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now, for a server about to start.

    It is drawn at random from just below the kernel's ephemeral range. A port that ``bind(0)`` returns is one
    the kernel also hands to outgoing connections, so between the probe and the server's own bind a client's
    connection (to Postgres, to Redis) could take it and the server would die on EADDRINUSE. Below the range only
    another server can take it, and a random draw makes two starters choosing the same one unlikely."""
    low, _ = _ephemeral_range()
    candidates = range(max(1024, low - 16384), low)
    for _ in range(200):
        port = _RANDOM.choice(candidates)
        if port not in _HANDED_OUT and port_is_free(port):
            _HANDED_OUT.add(port)
            return port
    with socket.socket() as probe:  # that whole range taken: the kernel's own choice, race and all
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def new_api_token() -> str:
    """A random API token (256 bits, URL-safe), what ``polar up`` / ``polar demo`` use when none is set."""
    return secrets.token_urlsafe(32)


@dataclass(frozen=True)
class ProcessSpec:
    name: str
    argv: list[str]
    health_url: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    ready_line: str | None = None  # a line in the process's log that says it is ready (for non-HTTP services)
    # How long it may take to get ready: a hang guard, not a start-up time. A process starts in seconds on a quiet
    # machine; a loaded one (a CI runner beside other jobs) has taken over a minute to import and bind.
    start_s: float = 180.0


EngineBackend = Literal["policy", "torch", "vllm"]
# Real vLLM loads, compiles and warms its model first: about a minute on 2 cores with its compile cache, some
# minutes without it or beside other work.
VLLM_START_S = 900.0
# The torch backend imports torch and loads the policy's weights before it answers: seconds alone, past a minute
# on a loaded machine (a CI run's embedded training stack).
TORCH_START_S = 300.0


def engine_spec(
    port: int,
    policy: str | None = "arithmetic",
    extra: Sequence[str] = (),
    name: str = "engine",
    backend: EngineBackend = "policy",
) -> ProcessSpec:
    """``polar engine`` on ``port``: the reference engine (``policy``/``torch`` backends), or real vLLM (``vllm``;
    ``policy`` None lets the model sample freely). Ready when it answers, echoing its stack's id: ``/health`` for
    the reference engine, ``/v1/models`` for vLLM (whose ``/health`` bypasses its middleware)."""
    argv = [PYTHON, "-m", "polar", "engine", "--host", "127.0.0.1", "--port", str(port), "--backend", backend]
    argv += ["--policy", policy] if policy is not None else []
    if backend == "vllm":
        return ProcessSpec(name, [*argv, *extra], f"http://127.0.0.1:{port}/v1/models", start_s=VLLM_START_S)
    start_s = TORCH_START_S if backend == "torch" else ProcessSpec.start_s
    return ProcessSpec(name, [*argv, *extra], f"http://127.0.0.1:{port}/health", start_s=start_s)


# The proxy's own gunicorn worker (web/gunicorn_worker.py; Linux): most of a small model call's proxy CPU was
# gthread's serving cost (docs/benchmarks.md).
PROXY_WORKER = "web.gunicorn_worker.EpollWorker" if hasattr(select, "epoll") else "gthread"


def gunicorn_spec(
    name: str, app: str, port: int, workers: int = 2, threads: int = 16, worker_class: str | None = None
) -> ProcessSpec:
    """``app`` under gunicorn, with Polar's gunicorn settings (``web/gunicorn_conf.py``: metrics of all workers),
    by ``worker_class`` (default: ``PROXY_WORKER`` for the proxy, ``gthread`` for the rest)."""
    worker_class = worker_class or (PROXY_WORKER if app.startswith("web.proxy:") else "gthread")
    argv = [
        PYTHON, "-m", "gunicorn", "--config", "python:web.gunicorn_conf", "--bind", f"127.0.0.1:{port}",
        "--workers", str(workers), "--worker-class", worker_class, "--threads", str(threads),
        "--graceful-timeout", "5", app,
    ]  # fmt: skip
    return ProcessSpec(name, argv, f"http://127.0.0.1:{port}/healthz")


@dataclass(frozen=True)
class NodeSpec:
    """One worker node: its ``POLAR_NODE`` name and, when it must not share one, its own work root."""

    name: str
    work_root: Path | None = None

    @property
    def env(self) -> dict[str, str]:
        env = {"POLAR_NODE": self.name}
        if self.work_root is not None:
            env["POLAR_WORK_ROOT"] = str(self.work_root)
        return env


# Which stages each Celery worker process consumes. ``per-stage`` is the production layout (docs/operations.md):
# one pool per stage queue, each sized, watched and restarted on its own. ``prep-and-run`` keeps the run pool
# (its threads are the node's run slots) and gives the short stages, init, ready and postrun, one process: half
# the processes for a small machine, where each Celery worker costs about 1.4 CPU-seconds to start and 10 ms a
# second while idle.
PoolLayout = Literal["per-stage", "prep-and-run"]
POOL_LAYOUTS: dict[str, dict[str, tuple[Stage, ...]]] = {
    "per-stage": {stage.value: (stage,) for stage in Stage},
    "prep-and-run": {"prep": (Stage.INIT, Stage.READY, Stage.POSTRUN), "run": (Stage.RUN,)},
}


def worker_spec(
    pool: str,
    stages: Sequence[Stage],
    concurrency: int,
    pool_type: str = "threads",
    node: NodeSpec | None = None,
    metrics_port: int | None = None,
) -> ProcessSpec:
    """A Celery worker named ``pool`` consuming the queues of ``stages`` (and, with ``node``, that node's own
    queues of them; the worker subscribes to those by itself). Named ``worker-<pool>``, or
    ``<node>-worker-<pool>``. With ``metrics_port`` it serves its stage metrics on
    ``http://127.0.0.1:<port>/metrics``."""
    hostname = f"{pool}@{node.name}" if node else f"{pool}@%h"
    queues = ",".join(stage.value for stage in stages)
    argv = [
        PYTHON, "-m", "celery", "-A", "workers", "worker", "--queues", queues, "--pool", pool_type,
        "--concurrency", str(concurrency), "--hostname", hostname, "--task-events",
        "--without-gossip", "--without-mingle", "--loglevel", "INFO",
    ]  # fmt: skip
    name = f"{node.name}-worker-{pool}" if node else f"worker-{pool}"
    env = dict(node.env) if node else {}
    if metrics_port:
        env["POLAR_WORKER_METRICS_PORT"] = str(metrics_port)
    return ProcessSpec(name, argv, ready_line=" ready.", env=env)


def stage_workers(
    run_concurrency: int, node: NodeSpec | None = None, metrics: bool = True, layout: PoolLayout = "per-stage"
) -> list[ProcessSpec]:
    """The worker pools of ``layout`` (of ``node``, when given), each serving its metrics on a free port of its
    own (``metrics_urls``) unless ``metrics`` is False. A pool's threads are the sum of its stages' sizes."""
    sizes = {Stage.INIT: max(2, run_concurrency), Stage.READY: 2, Stage.RUN: run_concurrency, Stage.POSTRUN: 2}
    specs = []
    for pool, stages in POOL_LAYOUTS[layout].items():
        port = free_port() if metrics else None
        specs.append(worker_spec(pool, stages, sum(sizes[stage] for stage in stages), node=node, metrics_port=port))
    return specs


def metrics_urls(specs: Sequence[ProcessSpec]) -> dict[str, str]:
    """Where each stage worker of ``specs`` serves its metrics, by process name."""
    return {
        spec.name: f"http://127.0.0.1:{spec.env['POLAR_WORKER_METRICS_PORT']}/metrics"
        for spec in specs
        if spec.env.get("POLAR_WORKER_METRICS_PORT")
    }


def pipeline_env(
    database_url: str,
    broker_url: str,
    ports: Mapping[str, int],
    state_dir: Path,
    run_concurrency: int,
    work_root: Path | None = None,
    api_token: str | None = None,
) -> dict[str, str]:
    """What every process of one deployment on this machine shares: where the database, the broker and each
    service (``ports``: engine, api, proxy) are, and the API token (``api_token``, else a new random one: the API
    never starts without one)."""
    env = {
        "POLAR_DATABASE_URL": database_url,
        "POLAR_BROKER_URL": broker_url,
        "POLAR_ENGINE_URLS": f"http://127.0.0.1:{ports['engine']}",
        "POLAR_PROXY_URL": f"http://127.0.0.1:{ports['proxy']}",
        "POLAR_API_URL": f"http://127.0.0.1:{ports['api']}",
        "POLAR_STATE_DIR": str(state_dir),
        "POLAR_RUN_CONCURRENCY": str(run_concurrency),
        "POLAR_API_TOKEN": api_token or new_api_token(),
    }
    if work_root is not None:
        env["POLAR_WORK_ROOT"] = str(work_root)
    return env


def pipeline_specs(
    ports: Mapping[str, int],
    policy: str | None,
    engine_args: Sequence[str],
    run_concurrency: int,
    proxy_workers: int = 2,
    proxy_threads: int = 16,
    nodes: Sequence[NodeSpec] = (),
    engine_backend: EngineBackend = "policy",
    layout: PoolLayout = "per-stage",
) -> list[ProcessSpec]:
    """The whole pipeline: the engine (``engine_spec``) with ``policy``, the API and proxy under gunicorn, and the
    stage worker pools of ``layout`` (one set per node of ``nodes``, or one set on this machine's own node)."""
    workers = [spec for node in nodes or [None] for spec in stage_workers(run_concurrency, node, layout=layout)]
    return [
        engine_spec(ports["engine"], policy, engine_args, backend=engine_backend),
        gunicorn_spec("api", "web.api:create_app()", ports["api"], workers=1, threads=8),
        gunicorn_spec("proxy", "web.proxy:create_app()", ports["proxy"], workers=proxy_workers, threads=proxy_threads),
        *workers,
    ]


class Stack:
    """A set of child processes sharing one environment, with logs in ``log_dir``.

    ``supervise()`` restarts a process that exits without being asked to, as a service manager would (a Celery
    worker can exit on a broker restart); ``hold(name)`` keeps one down on purpose until ``release(name)``.
    """

    def __init__(
        self, specs: Sequence[ProcessSpec], env: Mapping[str, str], log_dir: Path, cwd: Path | None = None
    ) -> None:
        self.specs = {spec.name: spec for spec in specs}
        self.env = dict(env)
        self.env.setdefault(instance.ENV, secrets.token_hex(8))  # its servers answer health checks with it
        self.log_dir = log_dir
        self.cwd = cwd  # where every process starts (default: this process's working directory)
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self._log_start: dict[str, int] = {}
        self._held: set[str] = set()
        self._lock = threading.Lock()
        self._supervising = threading.Event()
        self.restarts: list[tuple[str, int | None]] = []  # what the supervisor restarted, and its exit status

    def start_one(self, name: str) -> subprocess.Popen[bytes]:
        with self._lock:
            return self._start_one(name)

    def _start_one(self, name: str) -> subprocess.Popen[bytes]:
        spec = self.specs[name]
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with self.log(name).open("ab") as log:
            self._log_start[name] = log.tell()
            process = subprocess.Popen(
                spec.argv,
                cwd=self.cwd,
                env={**os.environ, **self.env, **spec.env},
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.processes[name] = process
        return process

    def start(self, timeout_s: float | None = None) -> None:
        """Start every process and wait until each is ready, within ``timeout_s`` (default: the slowest spec's
        ``start_s``)."""
        try:
            for name in self.specs:
                self.start_one(name)
            self.wait_healthy(timeout_s)
        except BaseException:
            self.stop()
            raise

    def wait_healthy(self, timeout_s: float | None = None, names: Sequence[str] | None = None) -> None:
        """Wait until every process (or those ``names``) answers its health check or logged its ready line, within
        ``timeout_s`` (default: the slowest one's ``start_s``); one that exits meanwhile fails the wait, unless the
        supervisor is there to start it again."""
        names = list(names or self.specs)
        timeout_s = timeout_s or max(self.specs[name].start_s for name in names)
        deadline = time.monotonic() + timeout_s
        # One client for every poll: a new one per request (httpx.get) builds an SSL context each time, 18 ms of CPU
        # (measured), which ten polls a second made a fifth of a core for as long as an engine took to start.
        with httpx.Client(timeout=1.0) as http:
            for name in names:
                spec = self.specs[name]
                while not self._ready(spec, http):
                    if self.processes[name].poll() is not None and not self._supervising.is_set():
                        returncode = self.processes[name].returncode
                        raise RuntimeError(f"{name} exited with {returncode}; see {self.log(name)}")
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"{name} not healthy after {timeout_s}s; see {self.log(name)}")
                    time.sleep(0.1)

    def _ready(self, spec: ProcessSpec, http: httpx.Client) -> bool:
        if spec.ready_line is not None:
            try:
                with self.log(spec.name).open("rb") as log:
                    log.seek(self._log_start.get(spec.name, 0))
                    return spec.ready_line.encode() in log.read()
            except OSError:
                return False
        if spec.health_url is None:
            return True
        try:
            response = http.get(spec.health_url)
        except httpx.HTTPError:
            return False
        # Another stack's server on the port (ours lost the race to bind it) is not ours being ready.
        return response.status_code == 200 and response.headers.get(instance.HEADER) == self.env[instance.ENV]

    def log(self, name: str) -> Path:
        return self.log_dir / f"{name}.log"

    def log_tails(self, lines: int = 30) -> str:
        """The last ``lines`` lines of every process's log, for a failure report."""
        parts = []
        for name in self.specs:
            try:
                tail = self.log(name).read_bytes()[-64 * 1024 :].decode(errors="replace").splitlines()[-lines:]
            except OSError as exc:
                tail = [f"(no log: {exc})"]
            parts.append(f"--- {name} ({self.log(name)}) ---\n" + "\n".join(tail))
        return "\n".join(parts)

    def signal(self, name: str, sig: int) -> None:
        os.killpg(self.processes[name].pid, sig)

    def stop_one(self, name: str, timeout_s: float = 10.0) -> None:
        with self._lock:
            process = self.processes.pop(name, None)
        if process is not None:
            _terminate([process], timeout_s)

    def hold(self, name: str) -> None:
        """Keep ``name`` down when it exits: the supervisor leaves it alone until ``release``."""
        with self._lock:
            self._held.add(name)

    def release(self, name: str) -> None:
        with self._lock:
            self._held.discard(name)

    def supervise(self, restart_after_s: float = 1.0) -> None:
        """From now on, restart (after ``restart_after_s``) any process that exits while not held or stopped."""
        self._supervising.set()
        threading.Thread(target=self._supervise, args=(restart_after_s,), name="stack-supervisor", daemon=True).start()

    def _supervise(self, restart_after_s: float) -> None:
        exited: dict[str, float] = {}
        while self._supervising.is_set():
            with self._lock:
                for name, process in list(self.processes.items()):
                    if process.poll() is None or name in self._held:
                        exited.pop(name, None)
                        continue
                    first_seen = exited.setdefault(name, time.monotonic())
                    if time.monotonic() - first_seen >= restart_after_s:
                        self.restarts.append((name, process.returncode))
                        exited.pop(name)
                        self._start_one(name)
            time.sleep(0.2)

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM every process group at once, then SIGKILL whatever has not left after ``timeout_s``."""
        self._supervising.clear()
        with self._lock:
            processes = list(self.processes.values())
            self.processes.clear()
        _terminate(processes, timeout_s)

    def __enter__(self) -> Stack:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


def _terminate(processes: Sequence[subprocess.Popen[bytes]], timeout_s: float) -> None:
    for process in processes:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for process in processes:
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
