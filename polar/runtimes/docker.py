"""The ``docker`` runtime: one container per session, reached through the Docker engine (``DOCKER_HOST``).

``create`` starts ``sleep infinity`` from ``spec.image`` (default ``polar-test:latest``) with:
- the session directory bind-mounted read-write at its host path, so ``session_dir`` is valid inside and out; it
  is a filesystem of its own of at most ``POLAR_SANDBOX_DISK_MB`` (``polar.runtimes.session_disk``), which the
  engine must see mounted (checked at create); the container's own writable layer is not bounded by Polar
  (``read_only_root`` leaves only the session directory and a bounded ``/tmp`` writable);
- the host's Python (venv, base interpreter, ``polar``) bind-mounted read-only at its host paths;
- no network (``network_mode="none"``: loopback only): the harness reaches the proxy, and nothing else, through
  the relay socket mounted read-only at ``/run/polar-proxy`` (``polar.runtimes.relay``);
- hardened: every capability dropped (a task with a ``workdir`` keeps CHOWN, DAC_OVERRIDE and FOWNER for the
  one root exec that hands the workdir over, so its idle PID 1 runs as root; the session's own processes always
  run as a non-root user with ``no-new-privileges``, so none of them ever holds a capability), optionally a
  read-only root filesystem (``runtime.read_only_root``: the session directory stays writable, ``/tmp`` is a
  tmpfs), and never the Docker socket;
- commands start in ``spec.workdir`` when given (an image's own directory, such as SWE-bench's ``/testbed``, made
  and chowned to that user at create), else in the session's ``work/``;
- copies in (``copy_in``) are written from the host into the session directory, which is the same path inside,
  streamed file by file and never through a link (``polar.runtimes.session_files``); a relative destination is
  under the session's ``work/`` even with a ``workdir``, and nothing outside the session directory (the image's
  own ``/testbed``, ``/opt``) is a destination: a prepare ``run`` step moves files there;
- the session's ``logs/`` also at ``/logs`` (Harbor's convention: verifiers write ``/logs/verifier/reward.txt``);
- ``spec.limits`` as CPU, memory and PID limits, the deployment's defaults (``POLAR_SANDBOX_*``) where a task
  sets none; labels ``polar.session``, ``polar.node``,
  ``polar.role`` and ``polar.deployment`` (which installation made it: the reaper only touches its own);
- a non-root user: the caller's uid, or 1000 when the caller is root (the session directory is chowned to it).

Timeouts: each command runs as a detached exec with its output appended to ``logs/<name>.log``; the host polls
it against the deadline. On timeout, and after every command (so background children never outlive it), an exec as
the session's user sends ``kill -9 -1``, which kills every process of that user in the container but PID 1 and
itself (the session's processes cannot change user: no capabilities, no new privileges). One command runs at a time per
session, so that is exactly the command's process tree, whatever process groups it made.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
import uuid
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import docker
from docker.errors import APIError, DockerException, NotFound

from polar.config import Config
from polar.contract.task_request import RuntimeSpec
from polar.errors import RuntimeFailure
from polar.runtimes import relay, session_disk
from polar.runtimes._host_python import host_tool_paths
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
from polar.runtimes.bounds import SandboxBounds
from polar.runtimes.session_files import chown_tree, fresh_session_dir, output_tail

DEFAULT_IMAGE = "polar-test:latest"
SESSION_LABEL = "polar.session"
NODE_LABEL = "polar.node"
ROLE_LABEL = "polar.role"
DEPLOYMENT_LABEL = "polar.deployment"
TICK_S = 0.2
# What the one root exec handing over a ``workdir`` needs (chown -R of an image's root-owned tree).
_HAND_OVER_CAPS = ["CHOWN", "DAC_OVERRIDE", "FOWNER"]
_RUN_LOGGED = 'log=$1; shift; exec "$@" >>"$log" 2>&1'


def engine_problem(image: str | None = None, timeout_s: float = 3.0) -> str | None:
    """None when a Docker engine answers and holds ``image``; otherwise why not (for a clear 400 at submission)."""
    try:
        client = docker.from_env(timeout=int(max(1, timeout_s)))
    except DockerException as exc:
        return f"no Docker engine answers ({exc})"
    try:
        client.ping()
        client.images.get(image or DEFAULT_IMAGE)
    except NotFound:
        return f"image {image or DEFAULT_IMAGE!r} is not on the Docker engine (build or pull it first)"
    except DockerException as exc:
        return f"no Docker engine answers ({exc})"
    finally:
        client.close()
    return None


def _client() -> docker.DockerClient:
    try:
        return docker.from_env()
    except DockerException as exc:
        raise RuntimeFailure(f"no Docker engine: {exc}") from exc


def _user() -> str:
    return "1000:1000" if os.getuid() == 0 else f"{os.getuid()}:{os.getgid()}"


def _session_dir(root: Path, user: str, disk_mb: int) -> None:
    uid, gid = (int(part) for part in user.split(":"))
    fresh_session_dir(root, owner=(uid, gid), disk_mb=disk_mb)


def _sees_the_mount(container: Any, root: Path, user: str) -> None:
    """The engine bound the session's own filesystem, not the directory beneath it (an engine in another mount
    namespace sees only that, and the session's files would go astray)."""
    result = container.exec_run(["/bin/sh", "-c", 'test -d "$1/logs"', "sh", str(root)], user=user)
    if result.exit_code != 0:
        raise RuntimeFailure(
            f"the Docker engine does not see the session directory {root} mounted (it runs in another mount "
            "namespace): run it beside the worker, or set POLAR_SANDBOX_DISK_MB=0"
        )


def _hand_over(container: Any, workdir: str, user: str) -> None:
    """``runtime.workdir`` (an image's own directory, e.g. SWE-bench's ``/testbed``) made and given to the session's
    user, who runs every command: images keep such directories root-owned."""
    result = container.exec_run(
        ["/bin/sh", "-c", 'mkdir -p "$1" && chown -R "$2" "$1"', "sh", workdir, user], user="root"
    )
    if result.exit_code != 0:
        output = result.output.decode(errors="replace")[-500:]
        raise RuntimeFailure(f"cannot hand workdir {workdir} to user {user}: {output}")


def _give_to_user(root: Path, user: str) -> None:
    """Files written from the host since create (harness configs, copies) belong to the worker's user: hand them
    to the container's user so the harness can read its config. Needs a root worker, as the chown at create."""
    uid, gid = (int(part) for part in user.split(":"))
    chown_tree(root, ".", uid, gid)  # links themselves, never what they point at; no hard-linked file


class DockerRuntime(Runtime):
    backend = "docker"

    def __init__(
        self, client: docker.DockerClient, container_id: str, root: Path, user: str, workdir: str | None = None
    ) -> None:
        self._client = client
        self._container_id = container_id
        self._root = root
        self._user = user
        self._workdir = workdir or str(root / "work")

    @classmethod
    def create(
        cls,
        session_id: uuid.UUID,
        spec: RuntimeSpec,
        config: Config,
        role: str = SESSION_ROLE,
        instance: str | None = None,
    ) -> DockerRuntime:
        client = _client()
        name = f"polar-{runtime_name(session_id, role, instance)}"
        root = Path(config.work_root).resolve() / runtime_name(session_id, role, instance)
        user = _user()
        volumes = {path: {"bind": path, "mode": "ro"} for path in host_tool_paths()}
        volumes[str(root)] = {"bind": str(root), "mode": "rw"}
        volumes[str(root / "logs")] = {"bind": "/logs", "mode": "rw"}
        volumes[str(relay.relay_dir(root))] = {"bind": relay.INSIDE_DIR, "mode": "ro"}
        disk_mb = session_disk.disk_mb(spec, config)
        try:
            _remove(client, name)  # an earlier, partial init of the same session
            _session_dir(root, user, disk_mb)
            relay.make_relay_dir(root)
            container = client.containers.run(
                spec.image or DEFAULT_IMAGE,
                ["sleep", "infinity"],
                name=name,
                detach=True,
                labels={
                    SESSION_LABEL: str(session_id),
                    NODE_LABEL: config.node,
                    ROLE_LABEL: role,
                    DEPLOYMENT_LABEL: config.deployment,
                },
                network_mode="none",
                volumes=volumes,
                # Root only where the workdir hand-over needs its capabilities: a root exec gets them only when
                # the container's own user is root. Every session command runs as ``user`` either way.
                user="0:0" if spec.workdir else user,
                working_dir=str(root / "work"),
                **_hardening(spec, config.sandbox_tmp_mb),
                **_limits(spec, config),
            )
            if disk_mb:
                _sees_the_mount(container, root, user)
            if spec.workdir:
                _hand_over(container, spec.workdir, user)
        except (DockerException, OSError) as exc:
            raise RuntimeFailure(f"cannot create container {name}: {exc}") from exc
        return cls(client, str(container.id), root, user, spec.workdir)

    @classmethod
    def attach(cls, handle: Mapping[str, Any], config: Config) -> DockerRuntime:
        session_disk.check_mounted(Path(handle["root"]))
        return cls(
            _client(),
            str(handle["container"]),
            Path(handle["root"]),
            str(handle.get("user", _user())),
            handle.get("workdir"),
        )

    @property
    def handle(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "container": self._container_id,
            "root": str(self._root),
            "user": self._user,
            "workdir": self._workdir,
        }

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
        api = self._client.api
        try:
            _give_to_user(self._root, self._user)
            exec_id = api.exec_create(
                self._container_id,
                ["/bin/sh", "-c", _RUN_LOGGED, "sh", str(log_path), *command],
                environment=dict(env),
                workdir=self._workdir,
                user=self._user,
            )["Id"]
            api.exec_start(exec_id, detach=True)
            state = api.exec_inspect(exec_id)
        except DockerException as exc:
            raise RuntimeFailure(f"cannot start {command[0]!r} in container {self._container_id[:12]}: {exc}") from exc
        if on_start:
            on_start(int(state.get("Pid") or 0))
        timed_out = False
        try:
            while state.get("Running"):
                left = seconds_left(timeout_s, started, time.monotonic())
                if left <= 0:
                    timed_out = True
                    break
                if on_tick:
                    on_tick()
                time.sleep(min(TICK_S, max(0.0, left)))
                state = api.exec_inspect(exec_id)
        except DockerException as exc:
            raise RuntimeFailure(f"lost the exec of {command[0]!r}: {exc}") from exc
        finally:
            self.kill_processes()
        return ExecResult(
            exit_code=None if timed_out else state.get("ExitCode"),
            timed_out=timed_out,
            duration_s=time.monotonic() - started,
            output_tail=output_tail(self._root, log_path),
        )

    @contextlib.contextmanager
    def proxy_access(
        self,
        proxy_url: str,
        egress_allow: Sequence[str] = (),
        bounds: SandboxBounds | None = None,
        key_hash: str | None = None,
    ) -> Iterator[relay.ProxyAccess]:
        uid, gid = (int(part) for part in self._user.split(":"))
        with relay.relayed(self._root, proxy_url, (uid, gid), egress_allow, bounds, key_hash) as access:
            yield access

    def is_alive(self) -> bool:
        try:
            return self._client.containers.get(self._container_id).status == "running"
        except DockerException:
            return False

    def kill_processes(self) -> None:
        try:
            self._client.containers.get(self._container_id).exec_run(["/bin/sh", "-c", "kill -9 -1"], user=self._user)
        except DockerException:
            pass  # gone or stopped: nothing runs in it

    def destroy(self) -> None:
        try:
            _remove(self._client, self._container_id)
        except DockerException as exc:
            raise RuntimeFailure(f"cannot remove container {self._container_id[:12]}: {exc}") from exc
        session_disk.remove(self._root)
        relay.remove_relay_dir(self._root)


def _hardening(spec: RuntimeSpec, tmp_mb: int) -> dict[str, Any]:
    options: dict[str, Any] = {
        "cap_drop": ["ALL"],
        "cap_add": _HAND_OVER_CAPS if spec.workdir else None,
        "security_opt": ["no-new-privileges:true"],
    }
    if spec.read_only_root:
        size = f",size={tmp_mb}m" if tmp_mb > 0 else ""  # POLAR_SANDBOX_TMP_MB: a tmpfs is host memory
        options.update(read_only=True, tmpfs={"/tmp": f"rw,nosuid,nodev{size}"})
    return options


def _limits(spec: RuntimeSpec, config: Config) -> dict[str, Any]:
    cpus = spec.limits.cpus or config.sandbox_cpus
    memory_mb = spec.limits.memory_mb or config.sandbox_memory_mb
    pids = spec.limits.pids or config.sandbox_pids
    limits: dict[str, Any] = {}
    if cpus:
        limits["nano_cpus"] = int(cpus * 1e9)
    if memory_mb:
        limits["mem_limit"] = f"{memory_mb}m"
    if pids:
        limits["pids_limit"] = pids
    return limits


# How long a removal someone else started may take before ours gives up (Docker removes a container's layers and
# volumes before the name is free; seconds on a loaded machine).
_REMOVAL_WAIT_S = 60.0


def _remove(client: docker.DockerClient, name_or_id: str) -> None:
    """Remove the container, gone already counting as done. A removal already under way (the reconciler reaping a
    container whose session just ended while its postrun removes it too) is waited for, not taken for a failure."""
    try:
        client.containers.get(name_or_id).remove(force=True)
    except NotFound:
        return
    except APIError as exc:
        if exc.status_code != 409 or "already in progress" not in str(exc.explanation):
            raise
        deadline = time.monotonic() + _REMOVAL_WAIT_S
        while time.monotonic() < deadline:
            try:
                client.containers.get(name_or_id)
            except NotFound:
                return
            time.sleep(0.2)
        raise


# The reconciler's client, kept for the process: it lists containers at every pass, and a new client costs more
# than the list itself (polar.stages.reconciler).
@functools.cache
def _reaper_client() -> docker.DockerClient:
    return _client()


def reap_orphans(node: str, deployment: str, live: Callable[[list[str]], Collection[str]]) -> int:
    """Remove this deployment's polar containers on this node whose session is terminal or unknown.

    ``live`` gets the session ids found on containers and returns those still live (not terminal). Containers are
    listed first, so a session whose ``init`` creates its container meanwhile is never mistaken for an orphan.
    Called from one thread (the reconciler's), which keeps one client.
    """
    client = _reaper_client()
    try:
        # Sparse: the list's own labels are enough, without an inspect per container.
        found = client.containers.list(
            all=True,
            sparse=True,
            filters={"label": [SESSION_LABEL, f"{NODE_LABEL}={node}", f"{DEPLOYMENT_LABEL}={deployment}"]},
        )
        sessions = {str(c.id): str((c.attrs.get("Labels") or {}).get(SESSION_LABEL)) for c in found}
        keep = set(live(list(sessions.values()))) if sessions else set()
        orphans = [container_id for container_id, session in sessions.items() if session not in keep]
        for container_id in orphans:
            _remove(client, container_id)
    except DockerException as exc:
        raise RuntimeFailure(f"cannot reap containers: {exc}") from exc
    return len(orphans)
