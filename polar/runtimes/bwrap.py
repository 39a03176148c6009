"""The ``bwrap`` runtime: the ``local`` runtime's session directory and process handling, every command run
inside a bubblewrap sandbox.

Inside the sandbox a command sees only: the system read-only (``/usr``, ``/etc`` and the ``/bin``, ``/lib*``,
``/sbin`` links or directories), a fresh ``/proc`` and ``/dev``, a private empty ``/tmp``, this Python's prefixes
and the ``polar`` package read-only (so ``python`` harnesses start), and its session directory read-write at the
same path as on the host. Nothing else of the host (``/root``, ``/home``, ``/work``, other sessions) exists.

All namespaces are unshared except the network: a new network namespace has its own loopback, and the harness
must reach the proxy on the host's 127.0.0.1. So the sandbox shares the host's network; keeping it to loopback
is the host's job (firewall, or a machine with no other network).

bwrap runs as the group leader the local runtime kills on timeout; ``--die-with-parent`` and the private PID
namespace take everything inside down with it.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path

from polar.errors import RuntimeFailure
from polar.runtimes._host_python import host_tool_paths
from polar.runtimes.base import ExecResult, StartHook, TickHook
from polar.runtimes.local import LocalRuntime

_SYSTEM_DIRS = ("/usr", "/etc")
_SYSTEM_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_NAMESPACES = ("--unshare-all", "--share-net", "--die-with-parent", "--new-session", "--cap-drop", "ALL")


def sandbox_args(session_dir: Path) -> list[str]:
    """The bwrap arguments (before the command) that confine a command to ``session_dir``."""
    args = [*_NAMESPACES]
    for directory in _SYSTEM_DIRS:
        args += ["--ro-bind", directory, directory]
    for link in _SYSTEM_LINKS:
        if os.path.islink(link):
            args += ["--symlink", os.readlink(link), link]
        elif os.path.isdir(link):
            args += ["--ro-bind", link, link]
    args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    for path in host_tool_paths():
        args += ["--ro-bind", path, path]
    # Last, so it wins over the private /tmp when sessions live under /tmp.
    args += ["--bind", str(session_dir), str(session_dir), "--chdir", str(session_dir / "work")]
    return args


class BwrapRuntime(LocalRuntime):
    backend = "bwrap"

    def exec(
        self,
        command: list[str],
        env: Mapping[str, str],
        timeout_s: float,
        log_name: str,
        on_start: StartHook | None = None,
        on_tick: TickHook | None = None,
    ) -> ExecResult:
        bwrap = shutil.which("bwrap")
        if bwrap is None:
            raise RuntimeFailure("the bwrap runtime needs bubblewrap: 'bwrap' is not on PATH")
        wrapped = [bwrap, *sandbox_args(self.session_dir), "--", *command]
        return super().exec(wrapped, env, timeout_s, log_name, on_start, on_tick)
