"""A task folder's ``tests/`` or ``solution/`` carried inside the task request, so the worker that judges or runs it
needs no access to the submitting host's files.

    files = pack(Path("my-task/tests"))            # [{"path": "test.sh", "content": "<base64>", "executable": true}]
    unpack(session_dir, "harbor/tests", files)     # written under the session directory, links refused

The request body is bounded (``MAX_BUNDLE_BYTES`` per folder): a verifier with gigabytes of fixtures belongs in
the task's image, not in every request.
"""

from __future__ import annotations

import base64
import binascii
import stat
from collections.abc import Sequence
from pathlib import Path, PurePosixPath

from pydantic import BaseModel, ConfigDict, Field, field_validator

from polar.errors import ValidationError
from polar.runtimes.session_files import make_dirs, write_file

MAX_BUNDLE_BYTES = 16 * 1024 * 1024


class BundleFile(BaseModel):
    """One file of a bundle: its path relative to the folder, its bytes as base64 and whether it is executable."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str = Field(min_length=1)
    content: str
    executable: bool = False

    @field_validator("path")
    @classmethod
    def _relative(cls, path: str) -> str:
        pure = PurePosixPath(path)
        if pure.is_absolute() or ".." in pure.parts or "\x00" in path:
            raise ValueError(f"{path!r} must be a relative path inside the folder, without '..'")
        return path

    @field_validator("content")
    @classmethod
    def _base64(cls, content: str) -> str:
        try:
            base64.b64decode(content, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ValueError(f"content is not base64: {exc}") from exc
        return content


def pack(folder: Path) -> list[dict[str, object]]:
    """Every regular file under ``folder`` (sorted), as bundle entries. A link or anything but a file or directory
    is refused (a task folder is data, and a link would carry the submitter's other files along)."""
    entries: list[dict[str, object]] = []
    total = 0
    for path in sorted(folder.rglob("*")):
        info = path.lstat()
        if stat.S_ISDIR(info.st_mode):
            continue
        if not stat.S_ISREG(info.st_mode):
            raise ValidationError(f"{path}: only plain files and folders can be carried (a link or device is not)")
        data = path.read_bytes()
        total += len(data)
        if total > MAX_BUNDLE_BYTES:
            raise ValidationError(
                f"{folder}: more than {MAX_BUNDLE_BYTES // (1024 * 1024)} MiB; put large fixtures in the task's image"
            )
        entries.append(
            {
                "path": path.relative_to(folder).as_posix(),
                "content": base64.b64encode(data).decode("ascii"),
                "executable": bool(info.st_mode & stat.S_IXUSR),
            }
        )
    return entries


def unpack(session_dir: Path, destination: str, files: Sequence[BundleFile]) -> Path:
    """Write ``files`` under ``session_dir / destination`` (replacing what is there file by file; never through a
    link: UnsafePath). Returns the destination directory."""
    for entry in files:
        mode = 0o755 if entry.executable else 0o644
        write_file(session_dir, f"{destination}/{entry.path}", base64.b64decode(entry.content), mode=mode)
    return make_dirs(session_dir, destination)


def run_from_mount(mount: str, script: str) -> str:
    """``sh -c`` text that runs ``script`` from the unpacked folder given as ``$1``, first refilling ``mount`` (the
    image's ``/tests`` or ``/solution``) with it when the image has that folder writable, as Harbor does."""
    return f"""set -e
src=$1
if [ -d {mount} ] && [ -w {mount} ]; then
  find {mount} -mindepth 1 -delete
  cp -R "$src/." {mount}/
  src={mount}
fi
exec bash "$src/{script}"
"""
