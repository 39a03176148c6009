"""Become an unprivileged user, then run a command: the first step inside a ``bwrap`` sandbox under a root worker.

    python -I unprivileged.py UID GID DIR -- COMMAND [ARG ...]

Under a root worker, bwrap's own user namespace maps the sandbox's user to the worker's, uid 0 outside, whatever
uid it shows inside: without capabilities that user still owns every root-owned file, so a harness could read
``/etc/shadow`` or an env file with secrets in the read-only ``/etc``. So bwrap makes no user namespace there,
keeps only CAP_SETUID and CAP_SETGID, and this step gives up the supplementary groups, the group and the user for
``UID:GID``. Changing every uid from 0 clears the remaining capabilities, and bwrap's ``no_new_privs`` keeps a
setuid binary from giving any back. Then it enters ``DIR`` (as that user: the session directory is theirs, mode
0700, which a root without capabilities cannot enter) and runs the command in this process's place
(``execvp``), so bwrap's ``--die-with-parent`` and PID namespace still hold it.

It runs by path under ``python -I`` with nothing but the standard library, like ``polar.runtimes.reaper``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence


def drop_to(uid: int, gid: int) -> None:
    """Become ``uid:gid`` for good (no supplementary group, no way back to root); OSError if any step fails."""
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    if os.getresuid() != (uid, uid, uid) or os.getresgid() != (gid, gid, gid) or os.getgroups():
        raise OSError(f"still {os.getresuid()}:{os.getresgid()} groups {os.getgroups()}")
    try:
        os.setuid(0)
    except PermissionError:
        return
    raise OSError("root could be taken back")


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 5 or args[3] != "--":
        print("usage: unprivileged.py UID GID DIR -- COMMAND [ARG ...]", file=sys.stderr)
        return 2
    try:
        drop_to(int(args[0]), int(args[1]))
    except (OSError, ValueError) as exc:  # never run the command as the worker's user
        print(f"polar sandbox: cannot become {args[0]}:{args[1]}: {exc}", file=sys.stderr)
        return 126
    try:
        os.chdir(args[2])
    except OSError as exc:
        print(f"polar sandbox: cannot enter {args[2]}: {exc}", file=sys.stderr)
        return 126
    command = args[4:]
    # bwrap set PWD to where it could enter, not here; tools that trust PWD (opencode does) would start in "/".
    os.environ["PWD"] = os.getcwd()
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        print(f"polar sandbox: cannot start {command[0]!r}: {exc}", file=sys.stderr)
        return 127
    return 127  # execvp does not return


if __name__ == "__main__":
    sys.exit(main())
