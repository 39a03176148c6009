"""The ``local`` runtime: a private directory per session, commands as host subprocesses. It does not isolate.

It is for harness code you trust. A command here runs as the worker's own user on the host's network: it can
reach Postgres, Redis, the API and the engine, read other sessions' directories and the embedded database, and
anything else that user can. Use ``bwrap`` or ``docker`` for code a policy writes.

What it does keep: each command starts in a new process group under ``polar.runtimes.reaper``, a child
subreaper, so a process that leaves the group with ``setsid`` (or double-forks) is still its descendant and
dies with the command. Output goes to ``logs/<name>.log`` in the session directory.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from polar.config import Config
from polar.contract.task_request import RuntimeSpec
from polar.errors import RuntimeFailure
from polar.runtimes import reaper, session_disk
from polar.runtimes.base import (
    SESSION_ROLE,
    ExecResult,
    Runtime,
    StartHook,
    TickHook,
    TimeLimit,
    runtime_name,
    seconds_left,
)
from polar.runtimes.session_files import fresh_session_dir, open_append, output_tail

TICK_S = 0.2
KILL_GRACE_S = 2.0


def kill_group(pgid: int, grace_s: float = KILL_GRACE_S) -> None:
    """SIGTERM a process group, then SIGKILL whatever is left after ``grace_s``."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 0.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)


def program_problem(command: list[str], env: Mapping[str, str]) -> str | None:
    """Why ``command`` cannot start (no such program, not executable), or None."""
    program = command[0]
    if "/" in program:
        return None if os.access(program, os.X_OK) else f"{program!r} is not an executable file"
    found = shutil.which(program, path=env.get("PATH", os.defpath))
    return None if found else f"{program!r} is not on PATH"


class LocalRuntime(Runtime):
    backend = "local"

    def __init__(self, root: Path, pgids: list[int]) -> None:
        self._root = root
        self._pgids = pgids

    @classmethod
    def create(
        cls,
        session_id: uuid.UUID,
        spec: RuntimeSpec,
        config: Config,
        role: str = SESSION_ROLE,
        instance: str | None = None,
    ) -> LocalRuntime:
        root = Path(config.work_root) / runtime_name(session_id, role, instance)
        try:
            fresh_session_dir(root, disk_mb=cls._disk_mb(spec, config))
        except OSError as exc:
            raise RuntimeFailure(f"cannot create session directory {root}: {exc}") from exc
        return cls(root, [])

    @classmethod
    def _disk_mb(cls, spec: RuntimeSpec, config: Config) -> int:
        """The session directory's bound in MiB (0: none). Here none: ``local`` does not confine its commands."""
        return 0

    @classmethod
    def attach(cls, handle: Mapping[str, Any], config: Config) -> LocalRuntime:
        return cls(Path(handle["root"]), list(handle.get("pgids", [])))

    @property
    def handle(self) -> dict[str, Any]:
        return {"backend": self.backend, "root": str(self._root), "pgids": list(self._pgids)}

    @property
    def session_dir(self) -> Path:
        return self._root

    def exec(
        self,
        command: list[str],
        env: Mapping[str, str],
        timeout_s: TimeLimit,
        log_name: str,
        on_start: StartHook | None = None,
        on_tick: TickHook | None = None,
    ) -> ExecResult:
        log_path = self._root / "logs" / f"{log_name}.log"
        started = time.monotonic()
        problem = program_problem(command, env)
        if problem:
            raise RuntimeFailure(f"cannot start {command[0]!r}: {problem}")
        with open_append(self._root, log_path) as log:
            try:
                process = subprocess.Popen(
                    self.confine(command),
                    cwd=self._root / "work",
                    env=dict(env),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            except OSError as exc:
                raise RuntimeFailure(f"cannot start {command[0]!r}: {exc}") from exc
        self._pgids.append(process.pid)
        if on_start:
            on_start(process.pid)
        timed_out = False
        try:
            while process.poll() is None:
                left = seconds_left(timeout_s, started, time.monotonic())
                if left <= 0:
                    timed_out = True
                    break
                if on_tick:
                    on_tick()
                try:
                    process.wait(timeout=min(TICK_S, max(0.0, left)))
                except subprocess.TimeoutExpired:
                    pass
        finally:
            # The harness may have left children behind even when it exited on its own.
            kill_group(process.pid, grace_s=KILL_GRACE_S if timed_out else 0.2)
            process.wait()
        return ExecResult(
            exit_code=None if timed_out else process.returncode,
            timed_out=timed_out,
            duration_s=time.monotonic() - started,
            output_tail=output_tail(self._root, log_path),
        )

    def confine(self, command: list[str]) -> list[str]:
        """``command`` as it is started: under the reaper, so nothing it starts outlives it."""
        return [sys.executable, "-I", reaper.__file__, "--", *command]

    def is_alive(self) -> bool:
        return (self._root / "work").is_dir()

    def kill_processes(self) -> None:
        for pgid in self._pgids:
            kill_group(pgid, grace_s=0.5)

    def destroy(self) -> None:
        self.kill_processes()
        session_disk.remove(self._root)
