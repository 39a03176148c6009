"""The ``bwrap`` runtime: the ``local`` runtime's session directory and process handling, every command run
inside a bubblewrap sandbox.

Inside the sandbox a command sees only: the system read-only (``/usr``, ``/etc`` and the ``/bin``, ``/lib*``,
``/sbin`` links or directories), a fresh ``/proc`` and ``/dev``, a private empty ``/tmp``, this Python's prefixes
and the ``polar`` package read-only (so ``python`` harnesses start), and its session directory read-write at the
same path as on the host. Nothing else of the host (``/root``, ``/home``, ``/work``, other sessions) exists.

Every namespace is unshared, the network too: the sandbox's loopback is its own, so no host service (Postgres,
Redis, the API, the engine) can be reached from it. The harness reaches the proxy, and nothing else, through the
relay socket mounted read-only at ``/run/polar-proxy`` (``polar.runtimes.relay``).

bwrap runs as the group leader the local runtime kills on timeout; ``--die-with-parent`` and the private PID
namespace take everything inside down with it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

from polar.config import Config
from polar.errors import RuntimeFailure
from polar.runtimes import relay
from polar.runtimes._host_python import host_tool_paths
from polar.runtimes.base import SESSION_ROLE
from polar.runtimes.bounds import SandboxBounds
from polar.runtimes.local import LocalRuntime
from polar.task_request import RuntimeSpec

_SYSTEM_DIRS = ("/usr", "/etc")
_SYSTEM_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_NAMESPACES = ("--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL")


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
    relay_dir = relay.relay_dir(session_dir)
    if relay_dir.is_dir():
        args += ["--ro-bind", str(relay_dir), relay.INSIDE_DIR]
    # Last, so it wins over the private /tmp when sessions live under /tmp.
    args += ["--bind", str(session_dir), str(session_dir), "--chdir", str(session_dir / "work")]
    return args


class BwrapRuntime(LocalRuntime):
    backend = "bwrap"

    @classmethod
    def create(
        cls,
        session_id: uuid.UUID,
        spec: RuntimeSpec,
        config: Config,
        role: str = SESSION_ROLE,
        instance: str | None = None,
    ) -> BwrapRuntime:
        runtime = super().create(session_id, spec, config, role, instance)
        relay.make_relay_dir(runtime.session_dir)
        return runtime  # type: ignore[return-value]

    def confine(self, command: list[str]) -> list[str]:
        bwrap = shutil.which("bwrap")
        if bwrap is None:
            raise RuntimeFailure("the bwrap runtime needs bubblewrap: 'bwrap' is not on PATH")
        return [bwrap, *sandbox_args(self.session_dir), "--", *command]

    @contextlib.contextmanager
    def proxy_access(
        self, proxy_url: str, egress_allow: Sequence[str] = (), bounds: SandboxBounds | None = None
    ) -> Iterator[relay.ProxyAccess]:
        with relay.relayed(self.session_dir, proxy_url, egress_allow=egress_allow, bounds=bounds) as access:
            yield access

    def destroy(self) -> None:
        super().destroy()
        relay.remove_relay_dir(self.session_dir)
