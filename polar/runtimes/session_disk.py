"""On the host: a sandboxed session's directory as a filesystem of its own, so its disk is bounded.

A bwrap or docker session's directory (``work/``, ``home/``, ``logs/``) is written by the policy, on the host's
disk: unbounded, one session could fill the work root's filesystem, and with it every other session and whatever
else lives there. So ``bound`` makes the directory the mount point of an ext4 filesystem of ``disk_mb`` MiB in a
sparse image file: a write past it fails with ENOSPC inside the sandbox (and on the host), and the host's
filesystem gives the session at most ``disk_mb`` (the image grows as it is written; ``discard`` gives back what is
deleted). Both runtimes reach the directory by its host path (bwrap ``--bind``, Docker's bind mount), so both see
the mounted filesystem; Docker's engine must share the worker's mount namespace, as one on the same host does.

The image lies in the session directory itself, under the mount (``IMAGE``): hidden while mounted, unreachable from
the sandbox, and removed with the directory (``remove``). A worker that can see it knows the mount is missing from
its mount namespace (``check_mounted``), rather than writing into the directory beneath it.

Mounting needs a root worker (``mount -o loop``); without one, a bounded session fails to start, saying so.
``POLAR_SANDBOX_DISK_MB`` (10240) sets the bound, ``runtime.limits.disk_mb`` a task's own; 0 turns it off.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from pathlib import Path

from polar.config import Config
from polar.contract.task_request import RuntimeSpec
from polar.errors import RuntimeFailure

IMAGE = ".polar-disk.img"
# Where mkfs.ext4, mount and umount live; a worker's PATH may lack the sbin directories.
_TOOL_PATH = "/usr/sbin:/sbin:/usr/bin:/bin"
_TOOL_TIMEOUT_S = 60.0
# No reserved blocks (the session's user gets all of it), no journal (a session's files do not outlive a crash
# of its host), lazy inode tables: a 10 GiB image is made in milliseconds and takes a few MiB until written.
_MKFS = ("-q", "-F", "-m", "0", "-O", "^has_journal", "-E", "lazy_itable_init=1,nodiscard")
_MOUNT_OPTIONS = "loop,nosuid,nodev,noatime,discard"


def disk_mb(spec: RuntimeSpec, config: Config) -> int:
    """The bound of a sandboxed session's directory in MiB: the task's ``runtime.limits.disk_mb``, else the
    deployment's ``POLAR_SANDBOX_DISK_MB``; 0 for none."""
    return spec.limits.disk_mb or config.sandbox_disk_mb


def _tool(name: str) -> str:
    found = shutil.which(name, path=_TOOL_PATH)
    if found is None:
        raise RuntimeFailure(f"bounding a session's disk needs {name!r} (util-linux, e2fsprogs), which is missing")
    return found


def _run(command: list[str], doing: str) -> None:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=_TOOL_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeFailure(f"cannot {doing}: {exc}") from exc
    if done.returncode != 0:
        raise RuntimeFailure(f"cannot {doing}: {(done.stderr or done.stdout).strip()}")


def bound(root: Path, size_mb: int) -> None:
    """Mount a fresh filesystem of ``size_mb`` MiB at ``root``, an empty directory just made (its owner and mode
    are the caller's to set). ``RuntimeFailure`` when it cannot be (no root worker, no loop device, tools missing)."""
    image = root / IMAGE
    fd = os.open(image, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.ftruncate(fd, size_mb * 1024 * 1024)  # sparse: disk is taken only as the session writes
    finally:
        os.close(fd)
    hint = "; set POLAR_SANDBOX_DISK_MB=0 to run sandboxes without a disk bound" if os.geteuid() != 0 else ""
    try:
        _run([_tool("mkfs.ext4"), *_MKFS, str(image)], f"make the {size_mb} MiB filesystem of {root}")
        _run(
            [_tool("mount"), "-t", "ext4", "-o", _MOUNT_OPTIONS, str(image), str(root)],
            f"mount the {size_mb} MiB filesystem of {root} (it needs a root worker){hint}",
        )
    except RuntimeFailure:
        image.unlink()
        raise
    with contextlib.suppress(FileNotFoundError):
        (root / "lost+found").rmdir()  # so the directory holds what an unbounded one does


def check_mounted(root: Path) -> None:
    """``RuntimeFailure`` when ``root`` was bounded but its filesystem is not mounted in this worker's mount
    namespace (another container's, a reboot since): its files are not the session's."""
    if not os.path.ismount(root) and os.path.lexists(root / IMAGE):
        raise RuntimeFailure(
            f"the session directory {root} is a filesystem of its own that is not mounted here: run every stage "
            "worker of a node in one mount namespace (or set POLAR_SANDBOX_DISK_MB=0)"
        )


def remove(root: Path) -> None:
    """Remove the session directory ``root``, unmounting its filesystem first (its image goes with it); gone
    already counts as done."""
    if root.is_symlink():
        root.unlink()
        return
    if os.path.ismount(root):
        # Lazily: a process still holding a file there keeps the filesystem alive, not the mount point.
        with contextlib.suppress(RuntimeFailure):
            _run([_tool("umount"), "--lazy", str(root)], f"unmount {root}")
    shutil.rmtree(root, ignore_errors=True)
