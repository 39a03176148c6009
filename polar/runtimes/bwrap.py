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

Commands never run as root. Under a non-root worker they run as the worker's user, in a user namespace of their
own. Under a root worker a user namespace would not help (its uid 0, shown as any uid inside, is the host's root,
which owns ``/etc/shadow`` even without capabilities), so there bwrap makes none, keeps only CAP_SETUID and
CAP_SETGID, and ``polar.runtimes.unprivileged`` turns every command into ``SANDBOX_USER`` before it starts; the
session directory and whatever the host wrote there is handed to that user before each command, as the Docker
runtime does. The private ``/tmp`` is a tmpfs of at most ``POLAR_SANDBOX_TMP_MB``; the session directory a
filesystem of its own of at most ``POLAR_SANDBOX_DISK_MB`` (``polar.runtimes.session_disk``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from polar.config import Config
from polar.contract.task_request import RuntimeSpec
from polar.errors import RuntimeFailure
from polar.runtimes import relay, session_disk, unprivileged
from polar.runtimes._host_python import host_tool_paths
from polar.runtimes.base import SESSION_ROLE, ExecResult, StartHook, TickHook, TimeLimit
from polar.runtimes.bounds import SandboxBounds
from polar.runtimes.local import LocalRuntime
from polar.runtimes.session_files import chown_tree

_SYSTEM_DIRS = ("/usr", "/etc")
_SYSTEM_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_NAMESPACES = ("--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL")
# Under a root worker: every namespace but the user's, and only the capabilities that giving up root takes.
_ROOT_NAMESPACES = (
    "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try", "--die-with-parent",
    "--new-session", "--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID",
)  # fmt: skip
# Who commands run as under a root worker: nobody/nogroup, which owns nothing on the host.
SANDBOX_USER = (65534, 65534)
DEFAULT_TMP_MB = 1024


def sandbox_user() -> tuple[int, int] | None:
    """The user commands become inside the sandbox: ``SANDBOX_USER`` under a root worker, None (the worker's own
    user, unprivileged already) otherwise."""
    return SANDBOX_USER if os.getuid() == 0 else None


def sandbox_args(session_dir: Path, tmp_mb: int = DEFAULT_TMP_MB, user: tuple[int, int] | None = None) -> list[str]:
    """The bwrap arguments (before the command) that confine a command to ``session_dir``, with a private ``/tmp``
    of at most ``tmp_mb`` MiB (0: unbounded); with ``user``, for a root worker (the command must then start with
    :func:`become`)."""
    args = [*(_ROOT_NAMESPACES if user else _NAMESPACES)]
    for directory in _SYSTEM_DIRS:
        args += ["--ro-bind", directory, directory]
    for link in _SYSTEM_LINKS:
        if os.path.islink(link):
            args += ["--symlink", os.readlink(link), link]
        elif os.path.isdir(link):
            args += ["--ro-bind", link, link]
    size = ["--size", str(tmp_mb * 1024 * 1024)] if tmp_mb > 0 else []
    args += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", *size, "--tmpfs", "/tmp"]
    bound, made = [*_SYSTEM_DIRS, *_SYSTEM_LINKS, "/proc", "/dev"], {"/tmp"}
    for path in host_tool_paths():
        args += [*_reachable(path, bound, made, user), "--ro-bind", path, path]
    relay_dir = relay.relay_dir(session_dir)
    if relay_dir.is_dir():
        args += [*_reachable(relay.INSIDE_DIR, bound, made, user), "--ro-bind", str(relay_dir), relay.INSIDE_DIR]
    # Last, so it wins over the private /tmp when sessions live under /tmp.
    args += [*_reachable(str(session_dir), bound, made, user), "--bind", str(session_dir), str(session_dir)]
    # With ``user`` the directory is entered by ``become``: it is that user's, mode 0700.
    return args if user else [*args, "--chdir", str(session_dir / "work")]


def _reachable(destination: str, bound: list[str], made: set[str], user: tuple[int, int] | None) -> list[str]:
    """With ``user``: the directories on the way to ``destination`` that bwrap would make (mode 0700, root's),
    made 0755 instead, so that the unprivileged user reaches what is mounted there. ``bound``: the host
    directories mounted so far (what is under them exists already), grown by ``destination``; ``made``: the
    directories made so far, grown by those made here."""
    args: list[str] = []
    if user is not None:
        for parent in reversed(Path(destination).parents):
            name = str(parent)
            inside_bound = any(parent == Path(b) or Path(b) in parent.parents for b in bound)
            if name != "/" and name not in made and not inside_bound:
                args += ["--perms", "0755", "--dir", name]
                made.add(name)
    bound.append(destination)
    return args


def become(user: tuple[int, int], workdir: Path, command: list[str]) -> list[str]:
    """``command`` run as ``user`` in ``workdir`` once it is inside (``polar.runtimes.unprivileged``)."""
    return [sys.executable, "-I", unprivileged.__file__, str(user[0]), str(user[1]), str(workdir), "--", *command]


class BwrapRuntime(LocalRuntime):
    backend = "bwrap"
    _tmp_mb: int = DEFAULT_TMP_MB  # the deployment's POLAR_SANDBOX_TMP_MB, set at create and attach

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
        assert isinstance(runtime, BwrapRuntime)
        runtime._tmp_mb = config.sandbox_tmp_mb
        user = sandbox_user()
        if user is not None:  # the fresh directory, work/, home/ and logs/ are the sandbox user's
            chown_tree(runtime.session_dir, ".", *user)
        relay.make_relay_dir(runtime.session_dir)
        return runtime

    @classmethod
    def _disk_mb(cls, spec: RuntimeSpec, config: Config) -> int:
        return session_disk.disk_mb(spec, config)

    @classmethod
    def attach(cls, handle: Mapping[str, Any], config: Config) -> BwrapRuntime:
        runtime = super().attach(handle, config)
        assert isinstance(runtime, BwrapRuntime)
        runtime._tmp_mb = config.sandbox_tmp_mb
        session_disk.check_mounted(runtime.session_dir)
        return runtime

    def exec(
        self,
        command: list[str],
        env: Mapping[str, str],
        timeout_s: TimeLimit,
        log_name: str,
        on_start: StartHook | None = None,
        on_tick: TickHook | None = None,
    ) -> ExecResult:
        user = sandbox_user()
        if user is not None:  # what the host wrote since (preset configs, copies) is the sandbox user's to change
            chown_tree(self.session_dir, ".", *user)
        return super().exec(command, env, timeout_s, log_name, on_start, on_tick)

    def confine(self, command: list[str]) -> list[str]:
        bwrap = shutil.which("bwrap")
        if bwrap is None:
            raise RuntimeFailure("the bwrap runtime needs bubblewrap: 'bwrap' is not on PATH")
        user = sandbox_user()
        inside = become(user, self.session_dir / "work", command) if user else command
        return [bwrap, *sandbox_args(self.session_dir, self._tmp_mb, user), "--", *inside]

    @contextlib.contextmanager
    def proxy_access(
        self,
        proxy_url: str,
        egress_allow: Sequence[str] = (),
        bounds: SandboxBounds | None = None,
        key_hash: str | None = None,
    ) -> Iterator[relay.ProxyAccess]:
        owner = sandbox_user()  # the sockets are the sandbox user's alone
        with relay.relayed(
            self.session_dir, proxy_url, owner=owner, egress_allow=egress_allow, bounds=bounds, key_hash=key_hash
        ) as access:
            yield access

    def destroy(self) -> None:
        super().destroy()
        relay.remove_relay_dir(self.session_dir)
