"""The runtime boundary: where a session's prepare steps, harness and evaluator run.

A runtime is created in ``init`` and reached again in later stages through its JSON ``handle`` (stored on the
session row), so any worker on the same node can attach to it.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, ClassVar

from polar.config import Config
from polar.contract.task_request import RuntimeSpec
from polar.errors import RuntimeFailure
from polar.runtimes.bounds import SandboxBounds
from polar.runtimes.relay import ProxyAccess, direct
from polar.runtimes.session_files import copy_into

# Host variables every command in a runtime keeps (locale, certificates, where programs are); everything else
# is withheld, so no host secret leaks into a harness or an evaluator's command.
PASSTHROUGH = ("PATH", "LANG", "LC_ALL", "TZ", "SSL_CERT_FILE", "SSL_CERT_DIR", "NODE_EXTRA_CA_CERTS")
# A session's own runtime; an evaluator that needs a clean one gets a second runtime of role EVALUATOR.
SESSION_ROLE = "session"
EVALUATOR_ROLE = "evaluator"


def runtime_name(session_id: uuid.UUID, role: str, instance: str | None = None) -> str:
    """The directory (and container) name of a session's runtime of ``role``; ``instance`` (a piece of the init
    claim's lease) gives each claim its own, so a re-run of init never touches a directory another is using."""
    name = str(session_id) if role == SESSION_ROLE else f"{session_id}-{role}"
    return f"{name}.{instance}" if instance else name


def command_env(session_dir: Path, extra: Mapping[str, str]) -> dict[str, str]:
    """The environment of a prepare step or an evaluator's command: the host's PASSTHROUGH variables, ``HOME`` in
    the session directory, then ``extra`` (the task's ``runtime.env``)."""
    env = {name: os.environ[name] for name in PASSTHROUGH if name in os.environ}
    env.update({"HOME": str(session_dir / "home"), **fenced_git(session_dir), **extra})
    return env


def fenced_git(session_dir: Path) -> dict[str, str]:
    """Git stops looking for a repository at the session directory: never the host's above it."""
    return {"GIT_CEILING_DIRECTORIES": str(session_dir.parent)}


@dataclass(frozen=True)
class ExecResult:
    """How a command ended: ``exit_code`` is None when it was killed for exceeding its time."""

    exit_code: int | None
    timed_out: bool
    duration_s: float
    output_tail: str


# Called with the started process's id (to record it for orphan clean-up) and then periodically while it runs.
StartHook = Callable[[int], None]
TickHook = Callable[[], None]
# A command's time limit: seconds from its start, or a function giving the seconds left now (a harness's budget,
# which a weight-sync pause extends while the command runs: ``polar.lifecycle.budget``).
TimeLimit = float | Callable[[], float]


def seconds_left(limit: TimeLimit, started: float, now: float) -> float:
    """What is left of ``limit`` at ``now`` for a command started at ``started`` (both ``time.monotonic()``)."""
    return limit() if callable(limit) else limit - (now - started)


class Runtime(ABC):
    backend: ClassVar[str]

    @classmethod
    @abstractmethod
    def create(
        cls,
        session_id: uuid.UUID,
        spec: RuntimeSpec,
        config: Config,
        role: str = SESSION_ROLE,
        instance: str | None = None,
    ) -> Runtime:
        """Create the session's runtime of ``role`` (named with ``instance`` when given; an earlier partial one of
        the same name is replaced)."""

    @classmethod
    @abstractmethod
    def attach(cls, handle: Mapping[str, Any], config: Config) -> Runtime:
        """Reach a runtime created earlier, from its handle."""

    @property
    @abstractmethod
    def handle(self) -> dict[str, Any]:
        """JSON that ``attach`` accepts; stored on the session row."""

    @property
    @abstractmethod
    def session_dir(self) -> Path:
        """The session's directory on the host: ``work/`` (where commands start), ``home/``, ``logs/``."""

    @abstractmethod
    def exec(
        self,
        command: list[str],
        env: Mapping[str, str],
        timeout_s: TimeLimit,
        log_name: str,
        on_start: StartHook | None = None,
        on_tick: TickHook | None = None,
    ) -> ExecResult:
        """Run ``command`` in the work directory; kill everything it started when ``timeout_s`` runs out (a
        number of seconds, or a function giving the seconds left, asked again each tick)."""

    @contextlib.contextmanager
    def proxy_access(
        self,
        proxy_url: str,
        egress_allow: Sequence[str] = (),
        bounds: SandboxBounds | None = None,
        key_hash: str | None = None,
    ) -> Iterator[ProxyAccess]:
        """How the harness reaches the proxy while the block runs. Here: directly (the ``local`` runtime shares
        the host's network); sandboxes give it a relay to the proxy and, with ``egress_allow``, a gate to those
        outside hosts, and nothing else (``polar.runtimes.relay``), both held to ``bounds``; with ``key_hash``
        (the sha256 of the session's proxy key), the relay carries that key's requests alone."""
        yield direct(proxy_url)

    def copy_in(self, host_path: Path, runtime_path: str, source_root: Path | None = None) -> None:
        """Copy a host file or directory into the runtime at ``runtime_path``: relative, under the work directory;
        absolute, anywhere in the session directory and nowhere else (every runtime has it at the same path inside
        and out). No link there is followed (``polar.runtimes.session_files``); with ``source_root``, neither is
        one on the way to ``host_path`` in that (another session's) directory. UnsafePath when refused."""
        target = PurePosixPath(runtime_path)
        target = target if target.is_absolute() else PurePosixPath("work", target)
        try:
            copy_into(self.session_dir, target, host_path, source_root)
        except OSError as exc:
            raise RuntimeFailure(f"cannot copy {host_path} to {runtime_path}: {exc}") from exc

    @abstractmethod
    def is_alive(self) -> bool:
        """True while the runtime can still run commands."""

    @abstractmethod
    def kill_processes(self) -> None:
        """Kill whatever a lost worker left running in this runtime."""

    @abstractmethod
    def destroy(self) -> None:
        """Remove the runtime; safe to call twice."""
