"""The local runtime: private directories, the proxy environment, process-group kills."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from polar.config import load_config
from polar.contract.task_request import RuntimeSpec
from polar.errors import RuntimeFailure
from polar.runtimes import attach_runtime, create_runtime
from tests.processes import process_alive, processes_with, wait_until

HANG_GUARD_S = 60  # command timeouts that must not fire, and waits: hang guards on a loaded machine


@pytest.fixture
def config(tmp_path: Path):  # type: ignore[no-untyped-def]
    return load_config({"POLAR_WORK_ROOT": str(tmp_path / "sessions")}, cwd=tmp_path)


def test_commands_run_in_the_work_directory(config) -> None:  # type: ignore[no-untyped-def]
    runtime = create_runtime(uuid.uuid4(), RuntimeSpec(), config)
    result = runtime.exec(["/bin/sh", "-c", "pwd; echo $GREETING"], {"GREETING": "hi"}, HANG_GUARD_S, "t")
    assert result.exit_code == 0 and not result.timed_out
    assert result.output_tail.splitlines() == [str(runtime.session_dir / "work"), "hi"]
    assert oct(runtime.session_dir.stat().st_mode)[-3:] == "700"


def test_timeout_kills_the_whole_group(config, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    runtime = create_runtime(uuid.uuid4(), RuntimeSpec(), config)
    pid_file = tmp_path / "grandchild"
    # The grandchild sleeps longer than pytest lets a test run: exec returned, and it is gone, only if the timeout
    # killed it (a timeout that waited for the group would fail the test on pytest's own timeout).
    result = runtime.exec(["/bin/sh", "-c", f"sleep 3600 & echo $! > {pid_file}; wait"], {}, 0.5, "t")
    assert result.timed_out and result.exit_code is None
    assert not process_alive(int(pid_file.read_text()))


def test_background_children_do_not_outlive_a_clean_exit(config, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    runtime = create_runtime(uuid.uuid4(), RuntimeSpec(), config)
    pid_file = tmp_path / "leftover"
    result = runtime.exec(["/bin/sh", "-c", f"sleep 60 & echo $! > {pid_file}"], {}, HANG_GUARD_S, "t")
    assert result.exit_code == 0
    assert not process_alive(int(pid_file.read_text()))


def test_attach_copy_and_destroy(config, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    runtime = create_runtime(uuid.uuid4(), RuntimeSpec(), config)
    source = tmp_path / "data.txt"
    source.write_text("payload")
    runtime.copy_in(source, "sub/data.txt")
    again = attach_runtime(runtime.handle, config)
    assert again.is_alive()
    assert (again.session_dir / "work" / "sub" / "data.txt").read_text() == "payload"
    again.destroy()
    assert not runtime.is_alive() and not runtime.session_dir.exists()
    again.destroy()  # twice is fine


def test_missing_program_is_a_runtime_failure(config) -> None:  # type: ignore[no-untyped-def]
    runtime = create_runtime(uuid.uuid4(), RuntimeSpec(), config)
    with pytest.raises(RuntimeFailure):
        runtime.exec(["/no/such/program"], {}, HANG_GUARD_S, "t")


@pytest.mark.parametrize("ending", ["exits", "times out"])
def test_a_setsid_child_dies_with_the_command(config, ending: str) -> None:  # type: ignore[no-untyped-def]
    """A process that leaves the command's group (``setsid``, double fork) is still killed with it."""
    runtime = create_runtime(uuid.uuid4(), RuntimeSpec(), config)
    marker = f"{uuid.uuid4().int % 10**6}.125"
    script = f"(setsid sleep {marker} &); (setsid sh -c 'sleep {marker}' &)" + (
        "; sleep 30" if ending == "times out" else ""
    )
    timeout_s = 1.0 if ending == "times out" else HANG_GUARD_S  # "exits": the timeout must not fire, however slow
    result = runtime.exec(["/bin/sh", "-c", script], {"PATH": "/usr/bin:/bin"}, timeout_s, "t")
    assert result.timed_out == (ending == "times out")
    assert wait_for_none(marker), f"left running: {processes_with(marker)}"


def wait_for_none(marker: str) -> bool:
    try:
        wait_until(lambda: not processes_with(marker), timeout_s=HANG_GUARD_S, message="no process left")
    except AssertionError:
        return False
    return True
