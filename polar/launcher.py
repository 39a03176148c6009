"""Starting Polar's processes on one machine: the reference engine, the API and proxy under gunicorn, and one
Celery worker pool per stage queue. ``polar up`` / ``polar demo`` use it with embedded defaults; the test suite
uses it against Postgres and Redis. It runs commands; it never imports the web or worker frameworks.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from polar.lifecycle.dispatch import Stage

PYTHON = sys.executable


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass(frozen=True)
class ProcessSpec:
    name: str
    argv: list[str]
    health_url: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    ready_line: str | None = None  # a line in the process's log that says it is ready (for non-HTTP services)


def engine_spec(port: int, policy: str = "arithmetic", extra: Sequence[str] = (), name: str = "engine") -> ProcessSpec:
    argv = [PYTHON, "-m", "polar", "engine", "--host", "127.0.0.1", "--port", str(port), "--policy", policy, *extra]
    return ProcessSpec(name, argv, f"http://127.0.0.1:{port}/health")


def gunicorn_spec(name: str, app: str, port: int, workers: int = 2, threads: int = 16) -> ProcessSpec:
    argv = [
        PYTHON, "-m", "gunicorn", "--bind", f"127.0.0.1:{port}", "--workers", str(workers),
        "--worker-class", "gthread", "--threads", str(threads), "--graceful-timeout", "5", app,
    ]  # fmt: skip
    return ProcessSpec(name, argv, f"http://127.0.0.1:{port}/healthz")


def worker_spec(stage: Stage, concurrency: int, pool: str = "threads") -> ProcessSpec:
    argv = [
        PYTHON, "-m", "celery", "-A", "workers", "worker", "--queues", stage.value, "--pool", pool,
        "--concurrency", str(concurrency), "--hostname", f"{stage.value}@%h", "--task-events",
        "--without-gossip", "--without-mingle", "--loglevel", "INFO",
    ]  # fmt: skip
    return ProcessSpec(f"worker-{stage.value}", argv, ready_line=" ready.")


def stage_workers(run_concurrency: int) -> list[ProcessSpec]:
    return [
        worker_spec(Stage.INIT, max(2, run_concurrency)),
        worker_spec(Stage.READY, 2),
        worker_spec(Stage.RUN, run_concurrency),
        worker_spec(Stage.POSTRUN, 2),
    ]


def pipeline_env(
    database_url: str,
    broker_url: str,
    ports: Mapping[str, int],
    state_dir: Path,
    run_concurrency: int,
    work_root: Path | None = None,
) -> dict[str, str]:
    """What every process of one deployment on this machine shares: where the database, the broker and each
    service (``ports``: engine, api, proxy) are."""
    env = {
        "POLAR_DATABASE_URL": database_url,
        "POLAR_BROKER_URL": broker_url,
        "POLAR_ENGINE_URLS": f"http://127.0.0.1:{ports['engine']}",
        "POLAR_PROXY_URL": f"http://127.0.0.1:{ports['proxy']}",
        "POLAR_API_URL": f"http://127.0.0.1:{ports['api']}",
        "POLAR_STATE_DIR": str(state_dir),
        "POLAR_RUN_CONCURRENCY": str(run_concurrency),
    }
    if work_root is not None:
        env["POLAR_WORK_ROOT"] = str(work_root)
    return env


def pipeline_specs(
    ports: Mapping[str, int],
    policy: str,
    engine_args: Sequence[str],
    run_concurrency: int,
    proxy_workers: int = 2,
    proxy_threads: int = 16,
) -> list[ProcessSpec]:
    """The whole pipeline: the reference engine with ``policy``, the API and proxy under gunicorn, and the four
    stage worker pools."""
    return [
        engine_spec(ports["engine"], policy, engine_args),
        gunicorn_spec("api", "web.api:create_app()", ports["api"], workers=1, threads=8),
        gunicorn_spec("proxy", "web.proxy:create_app()", ports["proxy"], workers=proxy_workers, threads=proxy_threads),
        *stage_workers(run_concurrency),
    ]


class Stack:
    """A set of child processes sharing one environment, with logs in ``log_dir``."""

    def __init__(self, specs: Sequence[ProcessSpec], env: Mapping[str, str], log_dir: Path) -> None:
        self.specs = {spec.name: spec for spec in specs}
        self.env = dict(env)
        self.log_dir = log_dir
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self._log_start: dict[str, int] = {}

    def start_one(self, name: str) -> subprocess.Popen[bytes]:
        spec = self.specs[name]
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with self.log(name).open("ab") as log:
            self._log_start[name] = log.tell()
            process = subprocess.Popen(
                spec.argv,
                env={**os.environ, **self.env, **spec.env},
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.processes[name] = process
        return process

    def start(self, timeout_s: float = 60.0) -> None:
        try:
            for name in self.specs:
                self.start_one(name)
            self.wait_healthy(timeout_s)
        except BaseException:
            self.stop()
            raise

    def wait_healthy(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        for name, spec in self.specs.items():
            while not self._ready(spec):
                if self.processes[name].poll() is not None:
                    raise RuntimeError(f"{name} exited with {self.processes[name].returncode}; see {self.log(name)}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{name} not healthy after {timeout_s}s; see {self.log(name)}")
                time.sleep(0.1)

    def _ready(self, spec: ProcessSpec) -> bool:
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
            return httpx.get(spec.health_url, timeout=1.0).status_code == 200
        except httpx.HTTPError:
            return False

    def log(self, name: str) -> Path:
        return self.log_dir / f"{name}.log"

    def signal(self, name: str, sig: int) -> None:
        os.killpg(self.processes[name].pid, sig)

    def stop_one(self, name: str, timeout_s: float = 10.0) -> None:
        process = self.processes.pop(name, None)
        if process is not None:
            _terminate([process], timeout_s)

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM every process group at once, then SIGKILL whatever has not left after ``timeout_s``."""
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
