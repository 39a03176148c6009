"""What the tests watch on this machine, and how long they wait for it: programs run to their end, processes
read from ``/proc`` (one parser of ``/proc/<pid>/stat``, tests/module_costs.py's too), a session's work
directories, and polls and requests bounded by one hang guard."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def proc_stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the process's name (``[0]`` its state, ``[1]`` its parent,
    ``[2]`` its process group, ``[11:15]`` utime, stime, cutime and cstime in clock ticks); None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2 :].split()


# Client timeouts and waits in the tests guard against hangs; they are not speed claims. They are sized for a
# machine running the whole suite beside other work (load averages of 9 on 2 cores were seen in CI), where a
# request a quiet machine answers in milliseconds can take seconds. httpx's own default (5 s) is too short there,
# so every test request names this one.
HANG_GUARD_S = 120.0


def run_to_end(command: list[str], timeout_s: float, cwd: str | Path) -> tuple[int, str]:
    """Run a program (an example's training loop) to its end: its exit code and output. Past ``timeout_s`` (a hang
    guard) it gets SIGTERM, which unwinds its stack (a SIGKILL would leave its engine and workers running), and
    the test fails with the output's end."""
    process = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        output, _ = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=60)
        raise AssertionError(f"{command[:4]} did not end within {timeout_s:.0f}s:\n{output[-3000:]}") from None
    return process.returncode, output


def wait_until(predicate: Callable[[], Any], timeout_s: float = 60, message: str = "condition") -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {message}")


def session_dirs(work_root: str | Path, session_id: object) -> list[Path]:
    """The directories a session's runtimes have under ``work_root`` (each init claim names its own:
    ``<id>.<claim>``, ``<id>-evaluator.<claim>``)."""
    return sorted(Path(work_root).glob(f"{session_id}*"))


def unmount_session_disks(under: Path) -> list[str]:
    """Unmount the session filesystems (``polar.runtimes.session_disk``) still mounted under ``under``: a bwrap or
    docker runtime a test never destroyed keeps its mount and loop device past the run otherwise. Returns them."""
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields, _, source = line.partition(" - ")
        point = fields.split()[4]
        if source.split()[:1] == ["ext4"] and Path(point).is_relative_to(under):
            points.append(point)
    for point in sorted(points, reverse=True):  # the deepest first
        subprocess.run(["umount", "--lazy", point], capture_output=True, check=False)
    return points


def process_alive(pid: int) -> bool:
    """True while ``pid`` runs; a zombie (killed, not yet reaped by an init that may never reap) counts as gone."""
    fields = proc_stat(pid)
    return fields is not None and fields[0] != "Z"


def processes_with(marker: str) -> list[int]:
    """Live (not zombie) processes on this machine whose command line contains ``marker``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and entry.name != str(os.getpid()):
            try:
                if marker.encode() in (entry / "cmdline").read_bytes() and process_alive(int(entry.name)):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


# A script for a sandbox: writes MiB after MiB (each synced, so the filesystem counts it) until a write fails or
# argv[1] MiB are written; prints what it wrote and the errno name of the failure (the disk bound's tests).
FILL_DISK = """
import errno, os, sys
written = 0
try:
    with open('fill', 'wb') as out:
        while written < int(sys.argv[1]):
            out.write(b'x' * 1048576); out.flush(); os.fsync(out.fileno()); written += 1
    print(written, 'OK')
except OSError as exc:
    print(written, errno.errorcode[exc.errno])
"""
