"""Runtimes: where sessions run. ``base`` is the interface; ``local`` a private directory on the host;
``bwrap`` the same directory with commands in a bubblewrap sandbox; ``docker`` a container per session. Every
one of them keeps the session directory on the host; whatever the host writes or reads there goes through
``session_files``, which never follows a link the session made; ``session_disk`` makes a sandbox's directory a
filesystem of its own, of bounded size; ``copy_steps`` bounds where copy steps read and write.

The registry maps the ``runtime.backend`` names of a TaskRequest to their classes (``docker`` only when the
``docker`` package is installed), each imported when first used; ``check_runtime`` also rejects a backend whose tool
or engine is missing here.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Mapping
from typing import Any

from polar.codec.import_path import LazyRegistry
from polar.config import Config
from polar.contract.task_request import RuntimeSpec
from polar.errors import RuntimeFailure, ValidationError
from polar.runtimes.base import EVALUATOR_ROLE, SESSION_ROLE, ExecResult, Runtime

# ``docker`` is a backend only where the Docker SDK is installed.
RUNTIMES: LazyRegistry[type[Runtime]] = LazyRegistry(
    {
        "local": "polar.runtimes.local:LocalRuntime",
        "bwrap": "polar.runtimes.bwrap:BwrapRuntime",
        "docker": "polar.runtimes.docker:DockerRuntime",
    },
    requires={"docker": "docker"},
)

__all__ = [
    "EVALUATOR_ROLE",
    "RUNTIMES",
    "SESSION_ROLE",
    "Availability",
    "BwrapRuntime",
    "ExecResult",
    "LocalRuntime",
    "Runtime",
    "attach_runtime",
    "check_runtime",
    "create_runtime",
]


# What ``check_runtime`` found of a backend and image, kept by a caller for one submission.
Availability = dict[tuple[str | None, str | None], str | None]


def check_runtime(spec: RuntimeSpec, field: str, seen: Availability | None = None) -> None:
    """Refuse a runtime this node cannot run. ``seen`` remembers each backend and image's answer across the calls
    of one submission: a batch of 100,000 docker tasks on one image asks the Docker engine once, not per task."""
    if spec.backend not in RUNTIMES:
        raise ValidationError(
            f"{field}.backend: {spec.backend!r} is not available here (available: {', '.join(sorted(RUNTIMES))})",
            field=f"{field}.backend",
        )
    check_confinement(spec, field)
    key = (spec.backend, spec.image if spec.backend == "docker" else None)
    if seen is None or key not in seen:
        problem = _unavailable(spec)
        if seen is not None:
            seen[key] = problem
    else:
        problem = seen[key]
    if problem:
        raise ValidationError(f"{field}.backend: {spec.backend!r} cannot run here: {problem}", field=f"{field}.backend")


def check_confinement(spec: RuntimeSpec, field: str) -> None:
    """Refuse what a backend would silently ignore: limits and a read-only root are Docker's alone, the
    sandbox sockets' bounds (``connections``, ``request_send_s``, ``tunnel_idle_s``) and the session directory's
    (``disk_mb``) a sandbox's (``local`` has no sockets and no disk of its own)."""
    limits = spec.limits
    if spec.backend == "local" and (limits.connections or limits.request_send_s or limits.tunnel_idle_s):
        raise ValidationError(
            f"{field}.limits: connections / request_send_s / tunnel_idle_s bound a sandbox's sockets; the local "
            "runtime has none (use backend 'bwrap' or 'docker', or drop them)",
            field=f"{field}.limits",
        )
    if spec.backend == "local" and limits.disk_mb:
        raise ValidationError(
            f"{field}.limits: disk_mb bounds a sandbox's session directory; the local runtime does not "
            "(use backend 'bwrap' or 'docker', or drop it)",
            field=f"{field}.limits",
        )
    if spec.backend == "docker":
        return
    if spec.limits.cpus or spec.limits.memory_mb or spec.limits.pids:
        raise ValidationError(
            f"{field}.limits: only the docker runtime enforces cpus / memory_mb / pids; "
            f"{spec.backend!r} would ignore them (use backend 'docker', or drop limits)",
            field=f"{field}.limits",
        )
    if spec.workdir is not None:
        raise ValidationError(
            f"{field}.workdir: only a docker runtime has a directory of its own to start in", field=f"{field}.workdir"
        )
    if spec.read_only_root:
        raise ValidationError(
            f"{field}.read_only_root: only the docker runtime has a root filesystem of its own",
            field=f"{field}.read_only_root",
        )


def _unavailable(spec: RuntimeSpec) -> str | None:
    if spec.backend == "bwrap" and shutil.which("bwrap") is None:
        return "bubblewrap ('bwrap') is not installed"
    if spec.backend == "docker":
        return engine_problem(spec.image)
    return None


def engine_problem(image: str | None = None) -> str | None:
    """Why this node cannot run a docker task on ``image`` (None: it can); the Docker SDK is imported only now."""
    from polar.runtimes import docker

    return docker.engine_problem(image)


def create_runtime(
    session_id: uuid.UUID, spec: RuntimeSpec, config: Config, role: str = SESSION_ROLE, instance: str | None = None
) -> Runtime:
    backend = spec.backend or config.default_runtime
    return RUNTIMES[backend].create(session_id, spec, config, role, instance)


def attach_runtime(handle: Mapping[str, Any], config: Config) -> Runtime:
    backend = handle.get("backend")
    if backend not in RUNTIMES:
        raise RuntimeFailure(f"unknown runtime backend {backend!r} in handle")
    return RUNTIMES[str(backend)].attach(handle, config)


def __getattr__(name: str) -> Any:
    """``BwrapRuntime`` and ``LocalRuntime``, imported when first named (as the registry imports them)."""
    classes = {"BwrapRuntime": "bwrap", "LocalRuntime": "local"}
    if name in classes:
        return RUNTIMES[classes[name]]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
