"""The runtimes never follow a session's links from the host: command logs, the session directory made at create,
copies in, output read back and ownership handed to a container's user. Each planted link points outside the
session, at ``tests.outside``, and nothing there may change."""

from __future__ import annotations

import os
import shutil
import stat
import uuid
from pathlib import Path

import pytest

from polar.config import load_config
from polar.contract.task_request import RuntimeSpec
from polar.runtimes import create_runtime
from polar.runtimes.base import runtime_name
from tests.docker_engine import require_docker_image
from tests.outside import SECRET, Outside, refusal


@pytest.fixture
def config(tmp_path: Path):  # type: ignore[no-untyped-def]
    return load_config({"POLAR_WORK_ROOT": str(tmp_path / "sessions"), "POLAR_NODE": "links"}, cwd=tmp_path)


@pytest.fixture
def outside(tmp_path: Path) -> Outside:
    return Outside.make(tmp_path)


def _backend(name: str) -> RuntimeSpec:
    if name == "bwrap" and shutil.which("bwrap") is None:
        pytest.skip("NO BWRAP: bubblewrap is not installed")
    if name == "docker":
        require_docker_image()
    return RuntimeSpec(backend=name)


@pytest.mark.parametrize("backend", ["local", "bwrap"])
def test_a_command_log_planted_as_a_link_is_refused(config, outside: Outside, backend: str) -> None:  # type: ignore[no-untyped-def]
    """The harness (or a prepare step) links ``logs/<name>.log`` to a ``.pth`` file; the next command's output
    would be appended there by the host."""
    runtime = create_runtime(uuid.uuid4(), _backend(backend), config)
    (runtime.session_dir / "logs" / "evaluator.log").symlink_to(outside.victim)
    refused = refusal(lambda: runtime.exec(["/bin/echo", "import os; os.system('id')"], {}, 10, "evaluator"))
    outside.assert_unchanged()
    assert refused is not None and "logs/evaluator.log" in refused


def test_a_session_directory_planted_as_a_link_is_replaced_not_followed(config, outside: Outside) -> None:  # type: ignore[no-untyped-def]
    """Create replaces an earlier partial directory of the same name; a link there is removed, never entered,
    chmod-ed or filled."""
    session_id = uuid.uuid4()
    planted = Path(config.work_root) / runtime_name(session_id, "session", "abcd1234")
    planted.parent.mkdir(parents=True)
    planted.symlink_to(outside.root, target_is_directory=True)
    runtime = create_runtime(session_id, RuntimeSpec(), config, instance="abcd1234")
    outside.assert_unchanged()
    assert not runtime.session_dir.is_symlink() and (runtime.session_dir / "work").is_dir()


def test_copy_in_does_not_follow_a_link_an_earlier_step_planted(config, outside: Outside, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    runtime = create_runtime(uuid.uuid4(), RuntimeSpec(), config)
    (runtime.session_dir / "work" / "evil").symlink_to(outside.root, target_is_directory=True)
    (runtime.session_dir / "work" / "file.pth").symlink_to(outside.victim)
    source = tmp_path / "payload.pth"
    source.write_text("import os\n")
    for target in ("evil/victim.pth", "file.pth", "evil"):
        refused = refusal(lambda target=target: runtime.copy_in(source, target))  # type: ignore[misc]
        assert refused is not None and target.split("/")[0] in refused
    tree = tmp_path / "tree"
    (tree / "evil").mkdir(parents=True)
    (tree / "evil" / "victim.pth").write_text("import os\n")
    assert refusal(lambda: runtime.copy_in(tree, ".")) is not None
    outside.assert_unchanged()


def test_copy_in_stays_in_the_session_directory(config, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    runtime = create_runtime(uuid.uuid4(), RuntimeSpec(), config)
    source = tmp_path / "data.txt"
    source.write_text("payload")
    for target in ("/opt/data.txt", str(tmp_path / "data2.txt"), "../home/x", "sub/../../x"):
        assert refusal(lambda target=target: runtime.copy_in(source, target)) is not None, target
    assert not (tmp_path / "data2.txt").exists()
    runtime.copy_in(source, str(runtime.session_dir / "swebench" / "data.txt"))  # absolute inside: allowed
    assert (runtime.session_dir / "swebench" / "data.txt").read_text() == "payload"


def test_copies_keep_links_as_links_and_leave_special_files_out(config, outside: Outside, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A tree's links are copied as links (their targets never read); FIFOs and sockets are left out."""
    runtime = create_runtime(uuid.uuid4(), RuntimeSpec(), config)
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub" / "file.txt").write_text("kept")
    (tree / "sub" / "file.txt").chmod(0o751)
    (tree / "secret").symlink_to(outside.secret)
    (tree / "relative").symlink_to("sub/file.txt")
    os.mkfifo(tree / "fifo")
    runtime.copy_in(tree, "copied")
    copied = runtime.session_dir / "work" / "copied"
    assert os.readlink(copied / "secret") == str(outside.secret)
    assert (copied / "relative").read_text() == "kept" and (copied / "relative").is_symlink()
    assert stat.S_IMODE((copied / "sub" / "file.txt").stat().st_mode) == 0o751
    assert not (copied / "fifo").exists()
    runtime.copy_in(tree / "sub" / "file.txt", ".")  # a file onto a directory goes inside it, as cp does
    assert (runtime.session_dir / "work" / "file.txt").read_text() == "kept"
    outside.assert_unchanged()


def test_a_docker_command_that_links_its_own_log_cannot_make_the_host_read(config, outside: Outside) -> None:  # type: ignore[no-untyped-def]
    """The log is written inside the container but read back on the host (the output tail kept with an error): a
    command that swaps its log for a link to a host path must not get that file's content into the session."""
    runtime = create_runtime(uuid.uuid4(), _backend("docker"), config)
    try:
        swap = f"rm -f /logs/t.log && ln -s {outside.secret} /logs/t.log && exit 3"
        result = runtime.exec(["/bin/sh", "-c", swap], {}, 30, "t")
        assert result.exit_code == 3
        assert SECRET not in result.output_tail
    finally:
        runtime.destroy()
    outside.assert_unchanged()


@pytest.mark.skipif(os.geteuid() != 0, reason="a worker hands files to the container's user only as root")
def test_handing_the_session_to_the_container_user_changes_nothing_outside(config, outside: Outside) -> None:  # type: ignore[no-untyped-def]
    from polar.runtimes.docker import _give_to_user

    root = Path(config.work_root) / "handed"
    (root / "work" / "sub").mkdir(parents=True)
    (root / "work" / "sub" / "mine.txt").write_text("x")
    (root / "work" / "dir").symlink_to(outside.root, target_is_directory=True)
    (root / "work" / "victim.pth").symlink_to(outside.victim)
    os.link(outside.secret, root / "work" / "hard")  # the same inode as a file outside
    _give_to_user(root, "1000:1000")
    outside.assert_unchanged()
    assert (root / "work" / "sub" / "mine.txt").stat().st_uid == 1000


@pytest.mark.skipif(os.geteuid() != 0, reason="the session directory is chowned to the container's user only as root")
def test_a_docker_session_directory_planted_as_a_link_is_not_chowned(config, outside: Outside) -> None:  # type: ignore[no-untyped-def]
    session_id = uuid.uuid4()
    planted = Path(config.work_root).resolve() / runtime_name(session_id, "session", "abcd1234")
    planted.parent.mkdir(parents=True)
    planted.symlink_to(outside.root, target_is_directory=True)
    runtime = create_runtime(session_id, _backend("docker"), config, instance="abcd1234")
    try:
        outside.assert_unchanged()
        assert not runtime.session_dir.is_symlink() and stat.S_IMODE(runtime.session_dir.stat().st_mode) == 0o700
    finally:
        runtime.destroy()


def test_docker_copies_land_in_the_session_directory_only(config, outside: Outside, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    runtime = create_runtime(uuid.uuid4(), _backend("docker"), config)
    try:
        source = tmp_path / "data.txt"
        source.write_text("payload")
        runtime.copy_in(source, "sub/data.txt")
        assert refusal(lambda: runtime.copy_in(source, "/opt/data.txt")) is not None
        made = runtime.exec(["/bin/sh", "-c", f"ln -s {outside.root} evil"], {}, 10, "t")
        assert made.exit_code == 0, made.output_tail
        assert refusal(lambda: runtime.copy_in(source, "evil/data.txt")) is not None
        result = runtime.exec(["/bin/sh", "-c", "cat sub/data.txt; echo >> sub/data.txt"], {}, 10, "t")
        assert (result.exit_code, result.output_tail) == (0, "payload")  # the container's user owns the copy
    finally:
        runtime.destroy()
    outside.assert_unchanged()


# The peak RSS of the copy alone: clear_refs 5 resets the high-water mark (ru_maxrss would carry the parent's).
_MEASURE_COPY = """
import sys, uuid
from pathlib import Path
from polar.config import load_config
from polar.runtimes import create_runtime
from polar.contract.task_request import RuntimeSpec

def status(field):
    line = next(l for l in open("/proc/self/status") if l.startswith(field + ":"))
    return int(line.split()[1]) // 1024

tmp = Path(sys.argv[1])
config = load_config({"POLAR_WORK_ROOT": str(tmp / "sessions"), "POLAR_NODE": "links"}, cwd=tmp)
runtime = create_runtime(uuid.uuid4(), RuntimeSpec(backend="docker"), config)
try:
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")
    before = status("VmRSS")
    runtime.copy_in(tmp / "tree", "tree")
    print(status("VmHWM") - before)
finally:
    runtime.destroy()
"""


def test_docker_copies_stream_rather_than_hold_the_tree_in_memory(tmp_path: Path) -> None:
    """A 64 MiB tree copied into a container grows the worker's peak memory by a few MiB, not by the tree."""
    import subprocess
    import sys

    _backend("docker")
    for index in range(4):
        (tmp_path / "tree" / f"d{index}").mkdir(parents=True)
        (tmp_path / "tree" / f"d{index}" / "blob").write_bytes(os.urandom(16 * 1024 * 1024))
    measured = subprocess.run(
        [sys.executable, "-c", _MEASURE_COPY, str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert measured.returncode == 0, measured.stderr
    assert int(measured.stdout.split()[-1]) < 16, f"peak RSS grew by {measured.stdout.strip()} MiB"
