"""A task's ``images``, copied into the session's work directory before its prepare steps and its harness run.

Each entry is a data URL (``data:image/png;base64,…``), written as ``image-<n>.<ext>`` (``n`` its place in the list,
from 1), or an absolute host path under ``POLAR_COPY_ROOTS``, copied under its own name (the bounds of a copy step,
``polar.runtimes.copy_steps``). Checked at submission (a 400 naming ``tasks[i].images[j]``) and again at copy time.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from polar.contract.task_request import TaskRequest
from polar.errors import ValidationError
from polar.protocols.images import decode_image, parse_data_url
from polar.runtimes.base import Runtime
from polar.runtimes.copy_steps import copy_source

EXTENSIONS = {"image/png": "png", "image/jpeg": "jpg", "image/gif": "gif", "image/webp": "webp"}


@dataclass(frozen=True)
class TaskImage:
    name: str  # its file name in the work directory
    data: bytes | None = None  # a data URL's bytes
    source: Path | None = None  # a host path's real path


def task_image(entry: str, position: int, roots: tuple[str, ...], max_bytes: int, field: str) -> TaskImage:
    """What one entry of ``images`` (at ``position``, from 0) copies in; ValidationError naming ``field`` when it is
    no image, is over ``max_bytes``, or is a path outside the copy roots."""
    if entry.startswith("data:"):
        declared, encoded = parse_data_url(entry, field)
        image = decode_image(encoded, declared, field, position, "task")
        assert image.data is not None
        if len(image.data) > max_bytes:
            raise ValidationError(f"{field}: {len(image.data):,} bytes, over the limit of {max_bytes:,} "
                                  "(POLAR_MAX_IMAGE_BYTES)", field=field)  # fmt: skip
        return TaskImage(f"image-{position + 1}.{EXTENSIONS[image.media_type]}", data=image.data)
    try:
        source = copy_source(entry, roots)
    except ValidationError as exc:
        raise ValidationError(f"{field}: {exc.message}", field=field) from None
    return TaskImage(source.name, source=source)


def check_task_images(task: TaskRequest, roots: tuple[str, ...], max_bytes: int, field: str) -> None:
    """Refuse a task (at ``field``, e.g. ``tasks[0]``) whose images are not images, too large, or outside the copy
    roots, or two of which would land under one name."""
    names: set[str] = set()
    for position, entry in enumerate(task.images):
        image = task_image(entry, position, roots, max_bytes, f"{field}.images[{position}]")
        if image.name in names:
            raise ValidationError(f"{field}.images[{position}]: a second image named {image.name!r}",
                                  field=f"{field}.images[{position}]")  # fmt: skip
        names.add(image.name)


def copy_task_images(runtime: Runtime, task: TaskRequest, roots: tuple[str, ...], max_bytes: int) -> list[str]:
    """Copy the task's images into ``runtime``'s work directory: the names they have there."""
    names = []
    for position, entry in enumerate(task.images):
        image = task_image(entry, position, roots, max_bytes, f"images[{position}]")
        if image.source is not None:
            if not image.source.is_file():
                raise ValidationError(f"images[{position}]: no file at {entry!r}", field=f"images[{position}]")
            runtime.copy_in(image.source, image.name)
        else:
            assert image.data is not None
            with tempfile.TemporaryDirectory(prefix="polar-image-") as scratch:
                path = Path(scratch) / image.name
                path.write_bytes(image.data)
                runtime.copy_in(path, image.name)
        names.append(image.name)
    return names
