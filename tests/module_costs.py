"""What each test module cost: wall seconds against CPU seconds of its test process and everything it started.

A module's CPU is the growth across it of ``RUSAGE_SELF`` + ``RUSAGE_CHILDREN`` + what the test process's live
descendants have used (their own CPU and that of the children they reaped). The stacks a module starts are reaped
when its fixtures stop them; the process's shared stack (tests/shared_stack.py) lives on from module to module, so
without the live descendants the sessions it runs for a module (Celery's pool, the harnesses) would land nowhere.
A process reaped in its parent moves its CPU from the live sum to its parent's, so nothing is counted twice; the
shared stack's start lands in the first module that asks for it and its stop in the process's last. CPU spent in
Docker containers or in the run's shared vLLM server is not counted. A module whose CPU is a
small part of its wall time mostly waits: ``waiting_modules`` (tests/waiting_lane.py) is where it belongs. The
controller's table ends with what the modules leave out: the shared vLLM server's CPU, and the whole machine's
busy CPU across the run against what its cores could give, so the rest (Postgres, Docker, pytest) shows too.

Each test process writes one line per module into the run's shared directory (with when it ended, in seconds
from its process's start, so an idle tail shows); the controller prints the table."""

from __future__ import annotations

import json
import os
import resource
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.processes import proc_stat

SHOWN = 20
KEEP_ENV = "POLAR_MODULE_COSTS"  # a path: the whole table (every module, JSON lines) is copied there at the end


def _machine_busy_s() -> float:
    """CPU-seconds every core of the machine has spent busy since boot (``/proc/stat``: all but idle and iowait)."""
    fields = [int(value) for value in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:8]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def _processes() -> Iterator[tuple[int, list[str]]]:
    """Every live process: its pid and the fields of ``/proc/<pid>/stat`` after its name (``fields[1]`` the ppid,
    ``fields[2]`` the process group, ``fields[11:15]`` utime, stime, cutime, cstime)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := proc_stat(int(entry.name))) is not None:
            yield int(entry.name), fields


def process_group_cpu_s(group: int) -> float:
    """CPU-seconds used so far by the live processes of process group ``group`` (their own, not reaped children's)."""
    total = sum(int(fields[11]) + int(fields[12]) for _, fields in _processes() if int(fields[2]) == group)
    return total / os.sysconf("SC_CLK_TCK")


def _live_descendants_cpu_s(root: int, skip: int | None) -> float:
    """CPU-seconds of ``root``'s live descendants (each one's own and its reaped children's), without ``skip``'s
    subtree."""
    children: dict[int, list[int]] = {}
    cpu: dict[int, int] = {}
    for pid, fields in _processes():
        children.setdefault(int(fields[1]), []).append(pid)
        cpu[pid] = sum(int(value) for value in fields[11:15])
    total, pending = 0, [pid for pid in children.get(root, []) if pid != skip]
    while pending:
        pid = pending.pop()
        total += cpu.get(pid, 0)
        pending.extend(child for child in children.get(pid, []) if child != skip)
    return total / os.sysconf("SC_CLK_TCK")


def _cpu_s(skip: int | None = None) -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    reaped = own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime
    return reaped + _live_descendants_cpu_s(os.getpid(), skip)


class ModuleCosts:
    """A pytest plugin: ``module_costs.jsonl`` in ``run_dir``, one line per module a test process finished."""

    def __init__(self, run_dir: Path, *, reports: bool, shared_server_pid: Callable[[], int | None]) -> None:
        self.path = run_dir / "module_costs.jsonl"
        self.shared_server_pid = shared_server_pid
        self.begun = (time.monotonic(), _machine_busy_s())
        self.reports = reports  # the controller (or a run without test processes) prints the table
        self.started: dict[str, tuple[float, float]] = {}

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        if item.location[0] not in self.started:
            self.started[item.location[0]] = (time.monotonic(), _cpu_s(self.shared_server_pid()))

    @pytest.hookimpl(wrapper=True, trylast=True)
    def pytest_runtest_teardown(self, item: pytest.Item, nextitem: pytest.Item | None) -> object:
        result = yield
        module = item.location[0]
        if (nextitem is None or nextitem.location[0] != module) and module in self.started:
            wall0, cpu0 = self.started.pop(module)
            now = time.monotonic()
            line = {"module": module, "wall_s": now - wall0, "cpu_s": _cpu_s(self.shared_server_pid()) - cpu0,
                    "process": os.environ.get("PYTEST_XDIST_WORKER", "main"),
                    "ended_s": round(now - self.begun[0], 1)}  # fmt: skip
            with self.path.open("a") as out:  # one short line per write: appends from processes do not interleave
                out.write(json.dumps(line) + "\n")
        return result

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.reports or not self.path.exists():
            return
        table = self.path.read_text()
        if os.environ.get(KEEP_ENV):
            Path(os.environ[KEEP_ENV]).write_text(table)
        rows = [json.loads(line) for line in table.splitlines()]
        rows.sort(key=lambda row: -row["wall_s"])
        terminalreporter.section(f"slowest {SHOWN} modules: wall against CPU (tests/module_costs.py)")
        total_cpu = sum(row["cpu_s"] for row in rows)
        for row in rows[:SHOWN]:
            share = row["cpu_s"] / row["wall_s"] if row["wall_s"] else 0.0
            figures = f"{row['wall_s']:7.1f}s wall {row['cpu_s']:7.1f}s CPU ({share:4.0%})"
            terminalreporter.write_line(f"{figures} {row['process']:>4} {row['module']}")
        terminalreporter.write_line(f"{len(rows)} modules, {total_cpu:.0f}s CPU in all (without Docker and vLLM)")
        server = self.shared_server_pid()
        if server is not None:
            terminalreporter.write_line(f"the shared vLLM server: {process_group_cpu_s(server):.0f}s CPU")
        wall, busy = time.monotonic() - self.begun[0], _machine_busy_s() - self.begun[1]
        cores = os.cpu_count() or 1
        terminalreporter.write_line(
            f"the machine: {busy:.0f}s CPU busy of {wall * cores:.0f}s ({cores} cores for {wall:.0f}s), whatever ran"
        )
