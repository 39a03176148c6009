"""The bwrap runtime: a sandbox that sees its session directory and the system, nothing else of the host."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from polar.config import load_config
from polar.contract.task_request import Limits, RuntimeSpec
from polar.errors import RuntimeFailure
from polar.runtimes import attach_runtime, create_runtime, session_disk
from tests.processes import FILL_DISK, processes_with, wait_until

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="NO BWRAP: bubblewrap is not installed")

BWRAP = RuntimeSpec(backend="bwrap")
HANG_GUARD_S = 60  # timeouts of commands that must not time out, and waits: hang guards on a loaded machine


@pytest.fixture
def config(tmp_path: Path):  # type: ignore[no-untyped-def]
    return load_config({"POLAR_WORK_ROOT": str(tmp_path / "sessions")}, cwd=tmp_path)


@pytest.fixture
def host_secrets(tmp_path: Path) -> Iterator[list[Path]]:
    """Files the host can read: one next to the session directories, one in the host's home."""
    secrets = [tmp_path / "secret.txt", Path.home() / f".polar-bwrap-secret-{uuid.uuid4().hex}"]
    for path in secrets:
        path.write_text("host secret")
    yield secrets
    secrets[1].unlink(missing_ok=True)


def test_the_host_outside_the_session_directory_is_invisible(config, host_secrets) -> None:  # type: ignore[no-untyped-def]
    runtime = create_runtime(uuid.uuid4(), BWRAP, config)
    for secret in host_secrets:
        assert secret.read_text() == "host secret"  # the host can
        result = runtime.exec(["/bin/cat", str(secret)], {}, HANG_GUARD_S, "t")
        assert result.exit_code != 0 and "host secret" not in result.output_tail
    listing = runtime.exec(["/bin/sh", "-c", "ls -A /root /home /work/main; ls /tmp"], {}, HANG_GUARD_S, "ls")
    # Only this Python's prefixes and the polar package are shown under /root and /work, read-only.
    assert "tests" not in listing.output_tail.split() and "setup.cfg" not in listing.output_tail.split()
    assert not any(path.name in listing.output_tail for path in host_secrets)


def test_it_writes_in_its_work_directory_and_nowhere_else(config) -> None:  # type: ignore[no-untyped-def]
    runtime = create_runtime(uuid.uuid4(), BWRAP, config)
    result = runtime.exec(
        ["/bin/sh", "-c", "pwd; echo made > out.txt; echo x > /usr/x || echo readonly"], {}, HANG_GUARD_S, "t"
    )
    assert result.exit_code == 0
    assert result.output_tail.splitlines()[0] == str(runtime.session_dir / "work")
    assert "readonly" in result.output_tail
    assert (runtime.session_dir / "work" / "out.txt").read_text() == "made\n"
    assert not Path("/usr/x").exists()


def test_python_runs_inside(config) -> None:  # type: ignore[no-untyped-def]
    runtime = create_runtime(uuid.uuid4(), BWRAP, config)
    code = "import polar.harnesses.python_entry, sys; print('ok', sys.prefix)"
    result = runtime.exec([sys.executable, "-c", code], {}, HANG_GUARD_S, "py")
    assert result.exit_code == 0, result.output_tail
    assert result.output_tail.split() == ["ok", sys.prefix]


def test_timeout_kills_everything_it_started(config) -> None:  # type: ignore[no-untyped-def]
    runtime = create_runtime(uuid.uuid4(), BWRAP, config)
    marker = f"{time.time() % 1000 + 600:.4f}"  # a sleep duration no other process uses
    script = f"sleep {marker} & (setsid sleep {marker} &) ; wait"
    # The sleeps outlast pytest's timeout for a test: exec returned and they are gone only if the timeout killed
    # them (a timeout that waited for them would fail the test on pytest's own timeout).
    result = runtime.exec(["/bin/sh", "-c", script], {}, 1.0, "t", on_start=lambda pid: None)
    assert result.timed_out and result.exit_code is None
    wait_until(lambda: not processes_with(f"sleep\0{marker}"), HANG_GUARD_S, "the sleeps gone")


def test_attach_and_destroy(config, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    runtime = create_runtime(uuid.uuid4(), BWRAP, config)
    source = tmp_path / "data.txt"
    source.write_text("payload")
    runtime.copy_in(source, "data.txt")
    again = attach_runtime(runtime.handle, config)
    assert again.handle["backend"] == "bwrap"
    assert again.exec(["/bin/cat", "data.txt"], {}, HANG_GUARD_S, "t").output_tail == "payload"
    again.destroy()
    assert not runtime.is_alive()
    again.destroy()


@pytest.mark.skipif(os.getuid() != 0, reason="the worker is not root here: commands run as its own user")
def test_under_a_root_worker_commands_run_as_an_unprivileged_user(config, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """AUDIT F13: a root worker's bwrap once ran commands as uid 0 without capabilities, which still owns
    /etc/shadow. What the host writes into the session (a copy, a preset's config) stays the harness's to change."""
    runtime = create_runtime(uuid.uuid4(), BWRAP, config)
    source = tmp_path / "data.txt"
    source.write_text("payload")
    runtime.copy_in(source, "data.txt")
    script = "id -u; id -G; cat /etc/shadow >/dev/null 2>&1 && echo READ-SHADOW; echo more >> data.txt && echo wrote"
    result = runtime.exec(["/bin/sh", "-c", script], {}, HANG_GUARD_S, "t")
    assert result.exit_code == 0, result.output_tail
    uid, groups, *rest = result.output_tail.split()
    assert (uid, groups) == ("65534", "65534") and "READ-SHADOW" not in rest and "wrote" in rest
    assert (runtime.session_dir / "work" / "data.txt").read_text() == "payloadmore\n"
    status = runtime.exec(["/bin/sh", "-c", "grep -E '^(CapEff|NoNewPrivs)' /proc/self/status"], {}, HANG_GUARD_S, "s")
    assert status.output_tail.split() == ["CapEff:", "0000000000000000", "NoNewPrivs:", "1"]
    # PWD names the work directory, as bwrap's --chdir set it: opencode starts where PWD says.
    where = runtime.exec(["/usr/bin/env"], {}, HANG_GUARD_S, "env").output_tail.splitlines()
    assert f"PWD={runtime.session_dir / 'work'}" in where


def test_the_private_tmp_is_bounded(tmp_path: Path) -> None:
    config = load_config({"POLAR_WORK_ROOT": str(tmp_path / "sessions"), "POLAR_SANDBOX_TMP_MB": "1"}, cwd=tmp_path)
    runtime = create_runtime(uuid.uuid4(), BWRAP, config)
    result = runtime.exec(["/bin/sh", "-c", "head -c 2000000 /dev/zero > /tmp/big"], {}, HANG_GUARD_S, "t")
    assert result.exit_code != 0 and "No space left" in result.output_tail


@pytest.mark.skipif(os.getuid() != 0, reason="the worker is not root here: it cannot mount a session's filesystem")
def test_writing_past_the_disk_bound_fails_with_enospc_and_nothing_outside_grows(tmp_path: Path) -> None:
    """POLAR_SANDBOX_DISK_MB=32: the session directory is a 32 MiB filesystem of its own. Writing 64 MiB inside
    stops with ENOSPC at its size (less ext4's own few MiB), and the work root's filesystem gives it no more."""
    config = load_config({"POLAR_WORK_ROOT": str(tmp_path / "sessions"), "POLAR_SANDBOX_DISK_MB": "32"}, cwd=tmp_path)
    runtime = create_runtime(uuid.uuid4(), BWRAP, config)
    root = runtime.session_dir
    try:
        assert os.path.ismount(root) and sorted(os.listdir(root)) == ["home", "logs", "work"]
        size = os.statvfs(root)
        assert 24 * 2**20 <= size.f_blocks * size.f_frsize <= 32 * 2**20
        result = runtime.exec([sys.executable, "-c", FILL_DISK, "64"], {}, HANG_GUARD_S, "fill")
        written, outcome = result.output_tail.split()
        assert outcome == "ENOSPC" and 24 <= int(written) < 32, result.output_tail
        beside = tmp_path / "sessions" / "beside"
        beside.write_bytes(b"x" * 2**20)  # the host's own filesystem is not full
        assert os.statvfs(root).f_bavail * os.statvfs(root).f_frsize < 2**20 and beside.stat().st_size == 2**20
        again = attach_runtime(runtime.handle, config)  # another worker of this mount namespace
        assert again.exec(["/bin/sh", "-c", "rm fill && echo freed"], {}, HANG_GUARD_S, "rm").output_tail == "freed\n"
    finally:
        runtime.destroy()
    assert not root.exists() and not os.path.ismount(root)


@pytest.mark.skipif(os.getuid() != 0, reason="the worker is not root here: it cannot mount a session's filesystem")
def test_a_worker_that_does_not_see_the_sessions_filesystem_refuses_it(tmp_path: Path) -> None:
    """As a worker in another mount namespace: the directory beneath the mount is not the session's."""
    config = load_config({"POLAR_WORK_ROOT": str(tmp_path / "sessions")}, cwd=tmp_path)
    runtime = create_runtime(uuid.uuid4(), RuntimeSpec(backend="bwrap", limits=Limits(disk_mb=16)), config)
    root = runtime.session_dir
    try:
        assert os.path.ismount(root) and os.statvfs(root).f_blocks * os.statvfs(root).f_frsize <= 16 * 2**20
        subprocess.run(["umount", "--lazy", str(root)], check=True)  # the mount gone from this namespace
        with pytest.raises(RuntimeFailure, match="not mounted here"):
            attach_runtime(runtime.handle, config)
    finally:
        runtime.destroy()
    assert not root.exists()


def test_without_a_disk_bound_the_session_directory_is_the_work_roots(tmp_path: Path) -> None:
    config = load_config({"POLAR_WORK_ROOT": str(tmp_path / "sessions"), "POLAR_SANDBOX_DISK_MB": "0"}, cwd=tmp_path)
    assert load_config({}, cwd=tmp_path).sandbox_disk_mb == 10240
    runtime = create_runtime(uuid.uuid4(), BWRAP, config)
    try:
        assert not os.path.ismount(runtime.session_dir)
        assert session_disk.disk_mb(RuntimeSpec(limits=Limits(disk_mb=64)), config) == 64  # a task's own wins
    finally:
        runtime.destroy()
