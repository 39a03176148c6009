"""The runtime boundary: where a session's prepare steps, harness and evaluator run.

A runtime is created in ``init`` and reached again in later stages through its JSON ``handle`` (stored on the
session row), so any worker on the same node can attach to it.
"""

from __future__ import annotations

import os
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from polar.config import Config
from polar.task_request import RuntimeSpec

OUTPUT_TAIL_BYTES = 4096
# The most of a session's output or files that Polar reads into memory at once (harness output, an evaluator
# command's log, an answer file): a policy can write gigabytes, and postrun must not die of it.
READ_LIMIT_BYTES = 8 * 1024 * 1024
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


def output_tail(path: Path) -> str:
    """The last ``OUTPUT_TAIL_BYTES`` of a command's log (kept with a failing session's error)."""
    try:
        with path.open("rb") as handle:
            handle.seek(max(0, path.stat().st_size - OUTPUT_TAIL_BYTES))
            return handle.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def read_output(path: Path, limit: int = READ_LIMIT_BYTES) -> str:
    """The text of ``path``, or its last ``limit`` bytes (where test summaries and answers are) after a line saying
    how much was left out. Raises ``OSError`` as ``Path.read_text`` does."""
    with path.open("rb") as handle:
        size = handle.seek(0, os.SEEK_END)
        if size <= limit:
            handle.seek(0)
            return handle.read().decode("utf-8", errors="replace")
        handle.seek(size - limit)
        tail = handle.read().decode("utf-8", errors="replace")
    return f"[polar: the first {size - limit} bytes of {size} were left out]\n{tail}"


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
        timeout_s: float,
        log_name: str,
        on_start: StartHook | None = None,
        on_tick: TickHook | None = None,
    ) -> ExecResult:
        """Run ``command`` in the work directory; kill everything it started when ``timeout_s`` runs out."""

    @abstractmethod
    def copy_in(self, host_path: Path, runtime_path: str) -> None:
        """Copy a host file or directory into the runtime (relative paths are under the work directory)."""

    @abstractmethod
    def is_alive(self) -> bool:
        """True while the runtime can still run commands."""

    @abstractmethod
    def kill_processes(self) -> None:
        """Kill whatever a lost worker left running in this runtime."""

    @abstractmethod
    def destroy(self) -> None:
        """Remove the runtime; safe to call twice."""
