"""The runtime boundary: where a session's prepare steps, harness and evaluator run.

A runtime is created in ``init`` and reached again in later stages through its JSON ``handle`` (stored on the
session row), so any worker on the same node can attach to it.
"""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from polar.config import Config
from polar.task_request import RuntimeSpec

OUTPUT_TAIL_BYTES = 4096


def output_tail(path: Path) -> str:
    """The last ``OUTPUT_TAIL_BYTES`` of a command's log (kept with a failing session's error)."""
    try:
        with path.open("rb") as handle:
            handle.seek(max(0, path.stat().st_size - OUTPUT_TAIL_BYTES))
            return handle.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


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
    def create(cls, session_id: uuid.UUID, spec: RuntimeSpec, config: Config) -> Runtime:
        """Create the runtime (idempotent: an earlier partial one for the same session is replaced)."""

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
