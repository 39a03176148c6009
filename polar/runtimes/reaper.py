"""Run a command so that nothing it starts outlives it, even what leaves its process group with ``setsid``.

    python -I reaper.py -- COMMAND [ARG ...]

This process makes itself a child subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``): every descendant orphaned by
its parent's exit — a daemon that double-forks, a ``setsid`` child — is re-parented here rather than to the
host's init. When the command exits, or this process is told to stop (SIGTERM/SIGINT/SIGHUP, as a timeout's
group kill sends), every descendant gets SIGTERM, then SIGKILL after a short grace; then it exits with the
command's status (128 + N when a signal N ended it).

It runs by path under ``python -I`` with nothing but the standard library (fast to start, nothing to plant).
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

PR_SET_CHILD_SUBREAPER = 36
GRACE_S = 0.5


def children() -> list[int]:
    """This process's children, from ``/proc`` (orphans re-parented here included)."""
    me = str(os.getpid())
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        if fields[1].decode() == me and fields[0] != b"Z":
            found.append(int(entry))
    return found


def reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def clear(grace_s: float = GRACE_S) -> None:
    """SIGTERM every descendant, SIGKILL what is left after ``grace_s``, until none is left."""
    deadline = time.monotonic() + grace_s
    sig = signal.SIGTERM
    while True:
        reap()
        left = children()
        if not left:
            return
        if time.monotonic() >= deadline:
            sig = signal.SIGKILL
        for pid in left:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        time.sleep(0.02)


class _Stop(Exception):
    pass


def _stop(_number: int, _frame: object) -> None:
    raise _Stop


def main(argv: Sequence[str] | None = None) -> int:
    command = list(sys.argv[1:] if argv is None else argv)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        print("usage: reaper.py -- COMMAND [ARG ...]", file=sys.stderr)
        return 2
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        print("polar reaper: cannot become a child subreaper; a setsid child may outlive the command", file=sys.stderr)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _stop)
    try:
        child = subprocess.Popen(command)
    except OSError as exc:
        print(f"polar reaper: cannot start {command[0]!r}: {exc}", file=sys.stderr)
        return 127
    try:
        child.wait()
    except _Stop:
        pass  # told to stop: the command's group got the same signal; clear what it leaves
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    clear()  # the command's whole tree, wherever in it an orphan went
    code = child.wait()
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main())
