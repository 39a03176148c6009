"""The primitives of ``polar.runtimes.session_files``: reads, writes, directories, ownership and copies in a
session directory that never follow the session's links. Each planted link points outside, at ``tests.outside``."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from polar.runtimes.session_files import (
    chown_tree,
    copy_into,
    fresh_session_dir,
    make_dirs,
    open_append,
    output_tail,
    read_output,
    remove_file,
    write_file,
)
from tests.outside import SECRET, STRANGER, VICTIM, Outside, refusal


@pytest.fixture
def outside(tmp_path: Path) -> Outside:
    return Outside.make(tmp_path)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A session directory as a runtime makes it."""
    root = tmp_path / "session"
    for sub in ("work", "home", "logs"):
        (root / sub).mkdir(parents=True)
    return root


def test_reads_refuse_links_on_the_way_and_special_files(root: Path, outside: Outside) -> None:
    (root / "work" / "answer.txt").symlink_to(outside.secret)
    (root / "work" / "dir").symlink_to(outside.root, target_is_directory=True)
    os.mkfifo(root / "work" / "fifo")
    for name in ("work/answer.txt", "work/dir/secret", "work/fifo"):
        refused = refusal(lambda name=name: read_output(root, name))  # type: ignore[misc]
        assert refused is not None and name in refused
    with pytest.raises(FileNotFoundError):
        read_output(root, "work/missing.txt")
    with pytest.raises(IsADirectoryError):
        read_output(root, "work")
    assert SECRET not in output_tail(root, "work/answer.txt")


def test_a_fifo_is_never_opened(root: Path) -> None:
    """Opening a FIFO for reading blocks until a writer comes: a harness could hang postrun forever."""
    os.mkfifo(root / "logs" / "harness.log")
    done = threading.Event()

    def read() -> None:
        refusal(lambda: read_output(root, "logs/harness.log"))
        done.set()

    threading.Thread(target=read, daemon=True).start()
    finished = done.wait(60)  # a hang guard, not a speed claim: a reader stuck in open() never finishes
    if not finished:  # unblock the reader stuck in open()
        os.close(os.open(root / "logs" / "harness.log", os.O_WRONLY | os.O_NONBLOCK))
    assert finished


def test_reading_is_bounded(root: Path) -> None:
    (root / "logs" / "harness.log").write_bytes(b"x" * (3 * 1024 * 1024) + b"\nthe answer is 42\n")
    text = read_output(root, "logs/harness.log", limit=1024 * 1024)
    assert text.startswith("[polar: the first 2097170 bytes of 3145746 were left out]\n")
    assert text.endswith("the answer is 42\n") and len(text) < 1024 * 1024 + 100
    assert output_tail(root, "logs/harness.log").endswith("the answer is 42\n")
    assert output_tail(root, "logs/missing.log") == ""


def test_writes_refuse_links_hard_links_and_escapes(root: Path, outside: Outside) -> None:
    (root / "logs" / "evaluator.log").symlink_to(outside.victim)
    (root / "home" / ".codex").symlink_to(outside.root, target_is_directory=True)
    os.link(outside.victim, root / "logs" / "hard.log")
    for name in ("logs/evaluator.log", "home/.codex/victim.pth", "home/.codex/new.json", "logs/hard.log"):
        assert refusal(lambda name=name: write_file(root, name, "x")) is not None, name  # type: ignore[misc]
        assert refusal(lambda name=name: open_append(root, name).close()) is not None, name  # type: ignore[misc]
    for name in ("../outside/victim.pth", str(outside.victim), "home/.codex/sub"):
        assert refusal(lambda name=name: make_dirs(root, name)) is not None, name  # type: ignore[misc]
    assert refusal(lambda: write_file(root, str(outside.victim), "x")) is not None
    assert refusal(lambda: remove_file(root, "home/.codex/victim.pth")) is not None
    outside.assert_unchanged()


def test_writes_make_private_files_in_fresh_directories(root: Path) -> None:
    path = write_file(root, root / "home" / ".codex" / "auth.json", '{"k": 1}', mode=0o600)
    assert path == root / "home" / ".codex" / "auth.json" and path.read_text() == '{"k": 1}'
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    write_file(root, "home/.codex/auth.json", "short")
    assert path.read_text() == "short"
    with open_append(root, "logs/t.log") as log:
        log.write(b"one\n")
    with open_append(root, "logs/t.log") as log:
        log.write(b"two\n")
    assert (root / "logs" / "t.log").read_text() == "one\ntwo\n"
    (root / "logs" / "link").symlink_to("t.log")
    remove_file(root, "logs/link")  # the link goes, not what it points at
    remove_file(root, "logs/never-made")
    assert not (root / "logs" / "link").is_symlink() and (root / "logs" / "t.log").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can hand files to another user")
def test_chown_tree_changes_only_what_is_inside(root: Path, outside: Outside) -> None:
    (root / "work" / "mine.txt").write_text("x")
    (root / "work" / "dir").symlink_to(outside.root, target_is_directory=True)
    (root / "work" / "file").symlink_to(outside.victim)
    os.link(outside.secret, root / "work" / "hard")
    chown_tree(root, ".", 1000, 1000)
    outside.assert_unchanged()
    assert (root / "work" / "mine.txt").stat().st_uid == 1000 and root.stat().st_uid == 1000
    assert os.lstat(root / "work" / "file").st_uid == 1000  # the link itself
    assert os.stat(root / "work" / "hard").st_uid == STRANGER


def test_copy_into_a_file_replaces_content_not_what_it_links(root: Path, outside: Outside, tmp_path: Path) -> None:
    source = tmp_path / "new.txt"
    source.write_text("new")
    (root / "work" / "old.txt").write_text("old, and longer")
    copy_into(root, "work/old.txt", source)
    assert (root / "work" / "old.txt").read_text() == "new"
    (root / "work" / "sub").mkdir()
    (root / "work" / "sub" / "victim.pth").symlink_to(outside.victim)
    assert refusal(lambda: copy_into(root, "work/sub/victim.pth", source)) is not None
    assert (outside.victim.read_text()) == VICTIM
    outside.assert_unchanged()


def test_a_work_root_others_could_swap_is_refused_before_anything_is_made_in_it(tmp_path: Path) -> None:
    """AUDIT F13: the default work root sits under the shared /tmp, where another user can make it first."""
    shared = tmp_path / "shared"  # a /tmp without the sticky bit
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(PermissionError, match=r"shared is writable by other users .* without the sticky bit"):
        fresh_session_dir(shared / "polar-x" / "sessions" / "s1")
    assert not (shared / "polar-x" / "sessions" / "s1").exists()
    shared.chmod(0o1777)  # as /tmp is: the names others make there stay theirs, and ours stay ours
    fresh_session_dir(shared / "polar-x" / "sessions" / "s1")
    assert (shared / "polar-x" / "sessions" / "s1" / "work").is_dir()


@pytest.mark.skipif(os.getuid() != 0, reason="only root can make a directory another user's")
def test_a_work_root_another_user_made_first_is_refused(tmp_path: Path) -> None:
    planted = tmp_path / "polar-x"  # what another local user made first under /tmp
    (planted / "sessions").mkdir(parents=True)
    os.chown(planted, 4321, 4321)
    with pytest.raises(PermissionError, match="polar-x belongs to uid 4321"):
        fresh_session_dir(planted / "sessions" / "s1")
    assert not (planted / "sessions" / "s1").exists()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    link = tmp_path / "polar-y"  # their link to a directory of ours: they could point it elsewhere later
    link.symlink_to(elsewhere)
    os.chown(link, 4321, 4321, follow_symlinks=False)
    with pytest.raises(PermissionError, match="polar-y belongs to uid 4321"):
        fresh_session_dir(link / "sessions" / "s1")
