"""Files in a session directory, touched from the host without following the session's links.

The harness owns its session directory (``work/``, ``home/``, ``logs/``): from inside its sandbox it can replace
any file or directory there with a symbolic link, a FIFO or a hard link. The host writes there too, often as
root: command and evaluator logs, the reward directory, harness configs, copies, ownership for a container's
user; and it reads answers, rewards, patches and logs back. Every such touch goes through here:

- a path is relative to the session root (or absolute under it) and never holds ``..``;
- each directory on the way is opened with ``O_DIRECTORY | O_NOFOLLOW`` relative to the one before (``dir_fd``),
  so a link anywhere on the path, made before or during the call, is refused rather than followed;
- a file is opened with ``O_NOFOLLOW | O_NONBLOCK`` only after ``lstat`` says it is a regular file, and checked
  again on the descriptor: FIFOs, devices and sockets are never opened (a FIFO would block postrun forever); a
  file written must have one link (a hard link would carry the write elsewhere);
- modes and owners change through descriptors or ``*at`` calls that do not follow links;
- copies keep links as links (never read through them) and leave FIFOs, sockets and devices out.

A refusal raises ``UnsafePath`` naming the path: the step that needed it fails (a prepare step, the harness's
launch, the evaluation) and nothing outside the session is touched. The root itself is trusted: the runtime made
it under the work root.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path, PurePath, PurePosixPath
from typing import BinaryIO

from polar.errors import UnsafePath
from polar.runtimes import session_disk
from polar.runtimes.work_root import ensure_work_root

OUTPUT_TAIL_BYTES = 4096
# The most of a session's output or files that Polar reads into memory at once (harness output, an evaluator
# command's log, an answer file): a policy can write gigabytes, and postrun must not die of it.
READ_LIMIT_BYTES = 8 * 1024 * 1024
COPY_CHUNK_BYTES = 1024 * 1024

_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC

SessionPath = str | PurePath


def _parts(root: Path, path: SessionPath) -> tuple[str, ...]:
    """``path`` as names under ``root``; UnsafePath when it leaves it."""
    pure = PurePosixPath(path)
    if pure.is_absolute():
        if not pure.is_relative_to(root):
            raise UnsafePath(f"{path} is outside the session directory {root}")
        pure = pure.relative_to(root)
    if ".." in pure.parts or "\x00" in str(pure):
        raise UnsafePath(f"{path} leaves the session directory {root} ('..')")
    return tuple(pure.parts)


def _shown(root: Path, parts: tuple[str, ...]) -> str:
    return str(root.joinpath(*parts))


def _refuse_link(parent: int, name: str, shown: str, exc: OSError, wanted: str = "") -> None:
    """Turn a no-follow open's failure into UnsafePath when a link is why (naming ``wanted``, the path asked for,
    when the link is on the way to it)."""
    if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
        try:
            info = os.stat(name, dir_fd=parent, follow_symlinks=False)
        except OSError:
            return
        if stat.S_ISLNK(info.st_mode):
            where = f" (on the way to {wanted})" if wanted and wanted != shown else ""
            raise UnsafePath(
                f"{shown} is a symbolic link{where}; Polar does not follow links in a session directory"
            ) from exc


def _child_dir(parent: int, name: str, shown: str, create: bool, wanted: str = "") -> int:
    """The directory ``name`` in ``parent`` opened without following a link (made first when ``create``)."""
    try:
        try:
            return os.open(name, _DIRECTORY, dir_fd=parent)
        except FileNotFoundError:
            if not create:
                raise
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, dir_fd=parent)
        return os.open(name, _DIRECTORY, dir_fd=parent)
    except OSError as exc:
        _refuse_link(parent, name, shown, exc, wanted)
        raise


@contextlib.contextmanager
def _directory(root: Path, parts: tuple[str, ...], create: bool = False, wanted: str = "") -> Iterator[int]:
    """A descriptor of the directory ``parts`` under ``root``, every step taken without following links."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for index, name in enumerate(parts):
            child = _child_dir(fd, name, _shown(root, parts[: index + 1]), create, wanted)
            os.close(fd)
            fd = child
        yield fd
    finally:
        os.close(fd)


def _open_at(parent: int, name: str, flags: int, shown: str, mode: int = 0o666) -> int:
    """Open the regular file ``name`` in ``parent``: never a link, FIFO, device or socket; one link when written."""
    try:
        before: os.stat_result | None = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        if not flags & os.O_CREAT:
            raise
        before = None
    if before is not None and stat.S_ISDIR(before.st_mode):
        raise IsADirectoryError(errno.EISDIR, "is a directory", shown)
    if before is not None and stat.S_ISLNK(before.st_mode):
        raise UnsafePath(f"{shown} is a symbolic link; Polar does not follow links in a session directory")
    if before is not None and not stat.S_ISREG(before.st_mode):
        raise UnsafePath(f"{shown} is {_kind(before.st_mode)}, not a regular file; Polar does not open it")
    try:
        fd = os.open(name, flags | _FILE, mode, dir_fd=parent)
    except OSError as exc:
        _refuse_link(parent, name, shown, exc)
        raise
    try:
        info = os.fstat(fd)
        same = before is None or (info.st_dev, info.st_ino) == (before.st_dev, before.st_ino)
        if not stat.S_ISREG(info.st_mode) or not same:
            raise UnsafePath(f"{shown} was replaced while being opened; Polar does not open it")
        if flags & (os.O_WRONLY | os.O_RDWR) and info.st_nlink > 1:
            raise UnsafePath(f"{shown} has {info.st_nlink} hard links; Polar does not write through them")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _kind(mode: int) -> str:
    return "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device"


def _open_file(root: Path, path: SessionPath, flags: int, mode: int = 0o666) -> int:
    parts = _parts(root, path)
    if not parts:
        raise IsADirectoryError(errno.EISDIR, "is a directory", str(root))
    shown = _shown(root, parts)
    with _directory(root, parts[:-1], create=bool(flags & os.O_CREAT), wanted=shown) as parent:
        return _open_at(parent, parts[-1], flags, shown, mode)


def fresh_session_dir(root: Path, owner: tuple[int, int] | None = None, disk_mb: int = 0) -> None:
    """Make the session directory ``root`` anew, mode 0700, with ``work/``, ``home/`` and ``logs/`` (all given to
    ``owner`` when set), with ``disk_mb``, a filesystem of that many MiB of its own (``polar.runtimes.session_disk``):
    whatever was there, an earlier partial one or a link in its place, is removed, never entered. ``OSError`` when
    it cannot be made (or something took its place meanwhile), PermissionError when another user could swap it
    (``polar.runtimes.work_root.ensure_work_root``), ``RuntimeFailure`` when its filesystem cannot be mounted."""
    ensure_work_root(root.parent)  # before anything is removed or made in it
    if root.is_symlink() or (root.exists() and not root.is_dir()):
        root.unlink()
    else:
        session_disk.remove(root)
    os.mkdir(root, 0o700)
    if disk_mb > 0:
        session_disk.bound(root, disk_mb)
    for sub in ((), ("work",), ("home",), ("logs",)):
        with _directory(root.parent, (root.name, *sub), create=True) as fd:
            if not sub:
                os.fchmod(fd, 0o700)
            if owner is not None:
                os.fchown(fd, *owner)


def _tail(root: Path, path: SessionPath, limit: int) -> tuple[str, int]:
    """The last ``limit`` bytes of the file at ``path`` under ``root`` as text, and the file's size."""
    with os.fdopen(_open_file(root, path, os.O_RDONLY), "rb") as handle:
        size = handle.seek(0, os.SEEK_END)
        handle.seek(max(0, size - limit))
        return handle.read(limit).decode("utf-8", errors="replace"), size


def read_output(root: Path, path: SessionPath, limit: int = READ_LIMIT_BYTES) -> str:
    """The text of the file at ``path`` under ``root``, or its last ``limit`` bytes (where test summaries and
    answers are) after a line saying how much was left out. ``OSError`` when it is missing or a directory,
    ``UnsafePath`` when it is a link or not a regular file."""
    text, size = _tail(root, path, limit)
    return text if size <= limit else f"[polar: the first {size - limit} bytes of {size} were left out]\n{text}"


def read_bytes(root: Path, path: SessionPath, limit: int | None = None) -> bytes:
    """The bytes of the file at ``path`` under ``root`` (refusals as ``read_output``). With ``limit``, a file
    larger than that is not read: ``FileTooLarge``, which says its size (one growing while it is read is cut at
    ``limit + 1`` bytes and refused alike)."""
    with os.fdopen(_open_file(root, path, os.O_RDONLY), "rb") as handle:
        if limit is None:
            return handle.read()
        size = os.fstat(handle.fileno()).st_size
        data = handle.read(limit + 1) if size <= limit else b""
        if size > limit or len(data) > limit:
            raise FileTooLarge(_shown(root, _parts(root, path)), max(size, len(data)), limit)
        return data


class FileTooLarge(OSError):
    """A file a session left that is larger than what Polar reads of it."""

    def __init__(self, shown: str, size: int, limit: int) -> None:
        super().__init__(errno.EFBIG, f"{size} bytes, over the limit of {limit}", shown)
        self.size = size
        self.limit = limit


def list_dir(root: Path, path: SessionPath) -> list[str]:
    """The names in the directory at ``path`` under ``root``, sorted (reached without following links)."""
    with _directory(root, _parts(root, path)) as fd:
        return sorted(os.listdir(fd))


def output_tail(root: Path, path: SessionPath) -> str:
    """The last ``OUTPUT_TAIL_BYTES`` of a command's log (kept with a failing session's error): empty when the log
    is missing, a note when the command left something else there."""
    try:
        return _tail(root, path, OUTPUT_TAIL_BYTES)[0]
    except UnsafePath as exc:
        return f"[polar: the log was not read: {exc}]"
    except OSError:
        return ""


def write_file(root: Path, path: SessionPath, data: bytes | str, mode: int | None = None) -> Path:
    """Write ``data`` to the file at ``path`` under ``root`` (directories on the way made), replacing its content;
    ``mode`` is set on it (a new file is made with it, so a secret is never readable by others meanwhile)."""
    fd = _open_file(root, path, os.O_WRONLY | os.O_CREAT, 0o666 if mode is None else mode)
    with os.fdopen(fd, "wb") as handle:
        os.ftruncate(fd, 0)
        if mode is not None:
            os.fchmod(fd, mode)
        handle.write(data.encode() if isinstance(data, str) else data)
    return root.joinpath(*_parts(root, path))


def open_append(root: Path, path: SessionPath) -> BinaryIO:
    """The file at ``path`` under ``root`` opened for appending (made when missing), e.g. a command's log."""
    return os.fdopen(_open_file(root, path, os.O_WRONLY | os.O_CREAT | os.O_APPEND), "ab")


def exists(root: Path, path: SessionPath, directories: bool = True) -> bool:
    """Whether anything (a link included, never followed; a directory only with ``directories``) is at ``path``
    under ``root``; UnsafePath when a directory on the way is a link."""
    parts = _parts(root, path)
    if not parts:
        return directories
    try:
        with _directory(root, parts[:-1], wanted=_shown(root, parts)) as parent:
            info = os.stat(parts[-1], dir_fd=parent, follow_symlinks=False)
    except (FileNotFoundError, NotADirectoryError):
        return False
    return directories or not stat.S_ISDIR(info.st_mode)


def remove_file(root: Path, path: SessionPath) -> None:
    """Remove the file or link at ``path`` under ``root`` (a link goes, not what it points at); nothing there is
    fine, a directory is left alone."""
    parts = _parts(root, path)
    try:
        with _directory(root, parts[:-1], wanted=_shown(root, parts)) as parent:
            os.unlink(parts[-1], dir_fd=parent)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        pass


def make_dirs(root: Path, path: SessionPath) -> Path:
    """Make the directory at ``path`` under ``root`` and those on the way (``mkdir -p`` that follows no link)."""
    parts = _parts(root, path)
    with _directory(root, parts, create=True, wanted=_shown(root, parts)):
        pass
    return root.joinpath(*parts)


def owner(root: Path, path: SessionPath) -> tuple[int, int]:
    """The uid and gid of the directory at ``path`` under ``root``."""
    with _directory(root, _parts(root, path)) as fd:
        info = os.fstat(fd)
    return info.st_uid, info.st_gid


def chown_dir(root: Path, path: SessionPath, uid: int, gid: int) -> None:
    """Give the directory at ``path`` under ``root`` (not its contents) to ``uid:gid``."""
    with _directory(root, _parts(root, path)) as fd:
        os.fchown(fd, uid, gid)


def chown_tree(root: Path, path: SessionPath, uid: int, gid: int) -> None:
    """Give the directory at ``path`` under ``root`` and everything in it to ``uid:gid``: links themselves (never
    what they point at), no file with more than one hard link. Entries this user may not change are skipped."""
    with _directory(root, _parts(root, path)) as top:
        with contextlib.suppress(PermissionError):
            os.fchown(top, uid, gid)
        for _, dirs, files, fd in os.fwalk(".", dir_fd=top, follow_symlinks=False):
            for name in (*dirs, *files):
                with contextlib.suppress(FileNotFoundError, PermissionError):
                    info = os.stat(name, dir_fd=fd, follow_symlinks=False)
                    if not (stat.S_ISREG(info.st_mode) and info.st_nlink > 1):
                        os.chown(name, uid, gid, dir_fd=fd, follow_symlinks=False)


def copy_into(root: Path, path: SessionPath, source: Path, source_root: Path | None = None) -> None:
    """Copy the file, link or directory ``source`` to ``path`` under ``root``: a directory's content merges into
    the directory there (made when missing), a file onto a directory goes inside it under its own name.

    ``source`` is a host path the caller vouched for (its last component is not followed); with ``source_root`` it
    is a path in that session directory, reached without following links. Links in a tree are copied as links;
    FIFOs, sockets and devices are left out; times and permission bits are kept."""
    target = _parts(root, path)
    src_root = source.parent if source_root is None else source_root
    src_parts = (source.name,) if source_root is None else _parts(source_root, source)
    if not src_parts:
        raise UnsafePath(f"{source}: copy a directory's entries, not the session directory itself")
    with _directory(src_root, src_parts[:-1], wanted=_shown(src_root, src_parts)) as src_parent:
        info = os.stat(src_parts[-1], dir_fd=src_parent, follow_symlinks=False)
        if stat.S_ISDIR(info.st_mode):
            with _directory(root, target, create=True, wanted=_shown(root, target)) as dst:
                _copy_tree(src_parent, src_parts[-1], dst, _shown(root, target))
            return
        if not target:
            raise IsADirectoryError(errno.EISDIR, "is a directory", str(root))
        with _directory(root, target[:-1], create=True, wanted=_shown(root, target)) as dst_parent:
            name, shown = target[-1], _shown(root, target)
            with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                if stat.S_ISDIR(os.stat(name, dir_fd=dst_parent, follow_symlinks=False).st_mode):
                    with _directory(root, target) as inside:
                        _copy_entry(src_parent, src_parts[-1], info, inside, src_parts[-1], f"{shown}/{src_parts[-1]}")
                    return
            _copy_entry(src_parent, src_parts[-1], info, dst_parent, name, shown)


def _copy_tree(src_parent: int, src_name: str, dst: int, shown: str) -> None:
    """Copy the entries of directory ``src_name`` (in ``src_parent``) into the open directory ``dst``. Directories
    are walked from a stack of names, reopened without following links, so no tree's depth or width runs out of
    recursion or descriptors."""
    pending: list[tuple[str, ...]] = [()]
    source_top = _child_dir(src_parent, src_name, src_name, create=False)
    try:
        while pending:
            relative = pending.pop()
            with _walk(source_top, relative) as src_fd, _walk(dst, relative, create=True, shown=shown) as dst_fd:
                with os.scandir(src_fd) as entries:
                    listed = [(entry.name, entry.stat(follow_symlinks=False)) for entry in entries]
                for name, info in listed:
                    entry_shown = "/".join((shown, *relative, name))
                    if stat.S_ISDIR(info.st_mode):
                        child = _child_dir(dst_fd, name, entry_shown, create=True)
                        with contextlib.suppress(PermissionError):
                            os.fchmod(child, stat.S_IMODE(info.st_mode) | stat.S_IRWXU)
                        os.close(child)
                        pending.append((*relative, name))
                    else:
                        _copy_entry(src_fd, name, info, dst_fd, name, entry_shown)
    finally:
        os.close(source_top)


@contextlib.contextmanager
def _walk(top: int, relative: tuple[str, ...], create: bool = False, shown: str = "") -> Iterator[int]:
    fd = os.dup(top)
    try:
        for index, name in enumerate(relative):
            child = _child_dir(fd, name, "/".join((shown, *relative[: index + 1])), create)
            os.close(fd)
            fd = child
        yield fd
    finally:
        os.close(fd)


def _copy_entry(src_dir: int, src_name: str, info: os.stat_result, dst_dir: int, name: str, shown: str) -> None:
    """Copy one file or link; leave anything else out."""
    if stat.S_ISLNK(info.st_mode):
        target = os.readlink(src_name, dir_fd=src_dir)
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISDIR(os.stat(name, dir_fd=dst_dir, follow_symlinks=False).st_mode):
                raise IsADirectoryError(errno.EISDIR, "a directory is where a link would go", shown)
            os.unlink(name, dir_fd=dst_dir)  # a link or file there is replaced, never written through
        os.symlink(target, name, dir_fd=dst_dir)
        return
    if not stat.S_ISREG(info.st_mode):
        return
    source = _open_at(src_dir, src_name, os.O_RDONLY, src_name)
    with os.fdopen(source, "rb") as reader:
        fd = _open_at(dst_dir, name, os.O_WRONLY | os.O_CREAT, shown, 0o600)
        with os.fdopen(fd, "wb") as writer:
            os.ftruncate(fd, 0)
            shutil.copyfileobj(reader, writer, COPY_CHUNK_BYTES)
            writer.flush()
            os.fchmod(fd, stat.S_IMODE(info.st_mode))
            os.utime(fd, ns=(info.st_atime_ns, info.st_mtime_ns))
