"""The docker runtime against a real engine: a container per session, the session directory shared at the same
path, timeouts that kill everything the command started, and nothing left behind."""

from __future__ import annotations

import os
import socket
import sys
import threading
import uuid
from pathlib import Path

import docker
import pytest

from polar.config import load_config
from polar.contract.task_request import Limits, RuntimeSpec
from polar.errors import RuntimeFailure, ValidationError
from polar.runtimes import attach_runtime, check_runtime, create_runtime
from polar.runtimes.docker import _sees_the_mount, reap_orphans
from tests.docker_engine import labelled_containers, require_docker_image
from tests.processes import FILL_DISK

DOCKER = RuntimeSpec(backend="docker")
HANG_GUARD_S = 120  # timeouts of commands that must not time out: hang guards on a loaded machine


@pytest.fixture(scope="module", autouse=True)
def docker_image() -> None:
    require_docker_image()


@pytest.fixture
def config(tmp_path: Path):  # type: ignore[no-untyped-def]
    return load_config({"POLAR_WORK_ROOT": str(tmp_path / "sessions"), "POLAR_NODE": "test-node"}, cwd=tmp_path)


def _container(runtime):  # type: ignore[no-untyped-def]
    return docker.from_env().containers.get(runtime.handle["container"])


def test_commands_run_in_the_container_and_write_to_the_shared_directory(config) -> None:  # type: ignore[no-untyped-def]
    session_id = uuid.uuid4()
    runtime = create_runtime(
        session_id, RuntimeSpec(backend="docker", limits=Limits(cpus=1, memory_mb=256, pids=64)), config
    )
    try:
        script = "pwd; id -u; echo $GREETING; test -f /.dockerenv && echo in-docker; echo made > out.txt"
        result = runtime.exec(["/bin/sh", "-c", script], {"GREETING": "hi"}, HANG_GUARD_S, "t")
        assert result.exit_code == 0 and not result.timed_out, result.output_tail
        assert result.output_tail.splitlines() == [str(runtime.session_dir / "work"), "1000", "hi", "in-docker"]
        assert (runtime.session_dir / "work" / "out.txt").read_text() == "made\n"
        attrs = _container(runtime).attrs
        assert attrs["Config"]["Labels"] == {
            "polar.session": str(session_id),
            "polar.node": "test-node",
            "polar.role": "session",
            "polar.deployment": config.deployment,
        }
        host = attrs["HostConfig"]
        # No network but its own loopback; no capabilities; no way to gain privileges; never the Docker socket.
        assert host["NetworkMode"] == "none"
        assert host["CapDrop"] == ["ALL"] and not host["CapAdd"]
        assert host["SecurityOpt"] == ["no-new-privileges:true"]
        assert not any("docker.sock" in mount["Source"] for mount in attrs["Mounts"])
        assert host["NanoCpus"] == 10**9 and host["PidsLimit"] == 64
        assert host["Memory"] == 256 * 2**20
        assert (
            runtime.exec(["/bin/cat", "/etc/hostname"], {}, HANG_GUARD_S, "h").output_tail.strip()
            != socket.gethostname()
        )
    finally:
        runtime.destroy()


def test_deployment_defaults_limit_a_task_that_sets_none(config) -> None:  # type: ignore[no-untyped-def]
    config = config.with_overrides(sandbox_cpus=0.5, sandbox_memory_mb=300, sandbox_pids=100)
    runtime = create_runtime(uuid.uuid4(), DOCKER, config)
    try:
        host = _container(runtime).attrs["HostConfig"]
        assert (host["NanoCpus"], host["Memory"], host["PidsLimit"]) == (5 * 10**8, 300 * 2**20, 100)
    finally:
        runtime.destroy()


def test_read_only_root_keeps_the_session_directory_and_tmp_writable(config) -> None:  # type: ignore[no-untyped-def]
    runtime = create_runtime(uuid.uuid4(), RuntimeSpec(backend="docker", read_only_root=True), config)
    try:
        script = "touch /opt/x 2>/dev/null && echo root-writable; touch /tmp/x ../home/x && echo ok"
        result = runtime.exec(["/bin/sh", "-c", script], {}, HANG_GUARD_S, "ro")
        assert result.output_tail.split() == ["ok"], result.output_tail
    finally:
        runtime.destroy()


def test_timeout_kills_everything_the_command_started(config) -> None:  # type: ignore[no-untyped-def]
    runtime = create_runtime(uuid.uuid4(), DOCKER, config)
    try:
        # The sleeps outlast pytest's timeout for a test: exec returned and they are gone only if the timeout
        # killed them (a timeout that waited for them would fail the test on pytest's own timeout).
        result = runtime.exec(["/bin/sh", "-c", "sleep 600 & (setsid sleep 600 &); wait"], {}, 1.0, "t")
        assert result.timed_out and result.exit_code is None
        top = _container(runtime).top(ps_args="-eo pid,args")["Processes"]
        assert [row for row in top if "sleep 600" in row[-1]] == []
        assert runtime.is_alive()
        assert runtime.exec(["/bin/true"], {}, HANG_GUARD_S, "after").exit_code == 0  # still usable
    finally:
        runtime.destroy()


def test_python_runs_inside(config) -> None:  # type: ignore[no-untyped-def]
    runtime = create_runtime(uuid.uuid4(), DOCKER, config)
    try:
        code = "import polar.harnesses.python_entry, sys; print('ok', sys.prefix)"
        result = runtime.exec([sys.executable, "-c", code], {}, HANG_GUARD_S, "py")
        assert result.exit_code == 0, result.output_tail
        assert result.output_tail.split() == ["ok", sys.prefix]
    finally:
        runtime.destroy()


def test_copy_attach_and_destroy_leave_nothing(config, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    runtime = create_runtime(uuid.uuid4(), DOCKER, config)
    source = tmp_path / "data.txt"
    source.write_text("payload")
    runtime.copy_in(source, "sub/data.txt")
    runtime.copy_in(source, str(runtime.session_dir / "extra" / "data.txt"))  # absolute: inside the session only
    again = attach_runtime(runtime.handle, config)
    assert again.is_alive()
    assert (
        again.exec(["/bin/cat", "sub/data.txt", "../extra/data.txt"], {}, HANG_GUARD_S, "t").output_tail
        == "payloadpayload"
    )
    again.destroy()
    assert not runtime.is_alive() and not runtime.session_dir.exists()
    again.destroy()  # twice is fine
    assert runtime.handle["container"] not in " ".join(labelled_containers())


def test_reap_orphans_removes_containers_of_dead_sessions(config) -> None:  # type: ignore[no-untyped-def]
    node = f"reap-{uuid.uuid4().hex[:8]}"
    config = config.with_overrides(node=node)
    # Another installation on the same engine and node: its sessions are unknown here, yet not ours to reap.
    neighbour = config.with_overrides(database_url="postgresql+psycopg://other@127.0.0.1/elsewhere")
    assert neighbour.deployment != config.deployment
    live_id = uuid.uuid4()
    live, dead = create_runtime(live_id, DOCKER, config), create_runtime(uuid.uuid4(), DOCKER, config)
    theirs = create_runtime(uuid.uuid4(), DOCKER, neighbour)
    try:
        assert reap_orphans(node, config.deployment, lambda found: {s for s in found if s == str(live_id)}) == 1
        assert live.is_alive() and not dead.is_alive() and theirs.is_alive()
    finally:
        for runtime in (live, dead, theirs):
            runtime.destroy()


def test_removals_at_once_all_succeed(config) -> None:  # type: ignore[no-untyped-def]
    # A session's postrun removing its container while the reconciler reaps it (the session is terminal already):
    # Docker answers the later removals 409 "removal ... already in progress"; that is the container going, not a
    # failure of the postrun. Three at once get that answer on every try here.
    runtime = create_runtime(uuid.uuid4(), DOCKER, config)
    removers = [attach_runtime(runtime.handle, config) for _ in range(3)]
    start, failures = threading.Barrier(len(removers)), []

    def remove(remover) -> None:  # type: ignore[no-untyped-def]
        start.wait()
        try:
            remover.destroy()
        except RuntimeFailure as exc:
            failures.append(exc)

    threads = [threading.Thread(target=remove, args=(remover,)) for remover in removers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(HANG_GUARD_S)
    assert failures == []
    assert not runtime.is_alive() and runtime.handle["container"] not in " ".join(labelled_containers())


def test_missing_image_is_rejected_at_submission() -> None:
    check_runtime(DOCKER, "tasks[0].runtime")
    with pytest.raises(ValidationError, match="not on the Docker engine"):
        check_runtime(RuntimeSpec(backend="docker", image="polar-no-such-image:0"), "tasks[0].runtime")


def test_commands_start_in_the_workdir_which_the_session_user_owns(config) -> None:  # type: ignore[no-untyped-def]
    # As SWE-bench's images keep the repository in a root-owned /testbed.
    spec = RuntimeSpec(backend="docker", workdir="/srv/testbed")
    runtime = create_runtime(uuid.uuid4(), spec, config)
    try:
        again = attach_runtime(runtime.handle, config)
        result = again.exec(["/bin/sh", "-c", "pwd && touch made && stat -c %u made"], {}, 30, "w")
        assert result.exit_code == 0, result.output_tail
        assert result.output_tail.split() == ["/srv/testbed", "1000" if os.getuid() == 0 else str(os.getuid())]
    finally:
        runtime.destroy()


@pytest.mark.skipif(os.getuid() != 0, reason="the worker is not root here: it cannot mount a session's filesystem")
def test_writing_past_the_disk_bound_fails_with_enospc_and_nothing_outside_grows(config) -> None:  # type: ignore[no-untyped-def]
    """``runtime.limits.disk_mb`` 32: the session directory, which the container binds, is a 32 MiB filesystem of
    its own. Writing 64 MiB inside the container stops with ENOSPC at its size (less ext4's own few MiB)."""
    runtime = create_runtime(uuid.uuid4(), RuntimeSpec(backend="docker", limits=Limits(disk_mb=32)), config)
    root = runtime.session_dir
    try:
        assert os.path.ismount(root)
        result = runtime.exec([sys.executable, "-c", FILL_DISK, "64"], {}, HANG_GUARD_S, "fill")
        written, outcome = result.output_tail.split()
        assert outcome == "ENOSPC" and 24 <= int(written) < 32, result.output_tail
        assert (root / "work" / "fill").stat().st_size == int(written) * 2**20  # the host sees the same files
        size = os.statvfs(root)
        assert size.f_blocks * size.f_frsize <= 32 * 2**20 and size.f_bavail * size.f_frsize < 2**20
        elsewhere = runtime.exec(["/bin/sh", "-c", "head -c 2000000 /dev/zero > /tmp/x && echo ok"], {}, 30, "t")
        assert elsewhere.output_tail == "ok\n"  # nothing else is full: the container's own /tmp takes it
        with pytest.raises(RuntimeFailure, match="does not see the session directory"):
            _sees_the_mount(_container(runtime), root / "work" / "nowhere", "1000:1000")  # as an engine elsewhere
    finally:
        runtime.destroy()
    assert not root.exists() and not os.path.ismount(root)
