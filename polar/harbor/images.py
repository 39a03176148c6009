"""A Harbor task's environment built into a local Docker image, cached by the content hash of ``environment/``.

    image = task_image(folder)      # "polar-harbor/<name>:<hash>", built once, reused while environment/ is unchanged

There is no registry: ``docker build`` runs on the local engine (``DOCKER_HOST``) and each ``FROM`` image must
already be on it (an air-gapped site loads or tags its mirrors under the names the Dockerfiles use; docs/harbor.md).
On top of the task's own image one layer adds ``/tests`` and ``/solution``, owned by nobody in particular and
writable by all (sticky, like ``/tmp``), because Polar runs the harness and the verifier as an unprivileged user
and Harbor's scripts expect their files there.
"""

from __future__ import annotations

import hashlib
import io
import re
from pathlib import Path

import docker
from docker.errors import BuildError, DockerException, ImageNotFound

from polar.errors import RuntimeFailure, ValidationError
from polar.harbor.task_folder import TaskFolder

REPOSITORY = "polar-harbor"
BUILD_TIMEOUT_S = 1800
_LAYER = """FROM {base}
USER root
RUN mkdir -p /tests /solution /logs && chmod 1777 /tests /solution
"""


def environment_hash(folder: Path) -> str:
    """The SHA-256 of every file's relative path, mode bit and content under ``folder``: what the image is cached by."""
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        if path.is_dir() and not path.is_symlink():
            continue
        relative = path.relative_to(folder).as_posix()
        data = str(path.readlink()).encode() if path.is_symlink() else path.read_bytes()
        digest.update(f"{relative}\0{path.lstat().st_mode & 0o111}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()


def image_tag(task: TaskFolder) -> str:
    """The local tag of ``task``'s image: its folder name and the hash of its environment (or of the prebuilt
    image it names)."""
    slug = re.sub(r"[^a-z0-9_.-]+", "-", task.name.lower()).strip("-.") or "task"
    if task.docker_image is not None:
        content = hashlib.sha256(f"image\0{task.docker_image}".encode()).hexdigest()
    else:
        content = environment_hash(task.environment_dir)
    return f"{REPOSITORY}/{slug[:100]}:{content[:16]}"


def task_image(task: TaskFolder) -> str:
    """``task``'s image on the local engine: built now when its tag is missing, else reused."""
    tag = image_tag(task)
    try:
        client = docker.from_env(timeout=BUILD_TIMEOUT_S)
    except DockerException as exc:
        raise RuntimeFailure(f"no Docker engine to build {task.name}'s environment: {exc}") from exc
    try:
        try:
            client.images.get(tag)
            return tag
        except ImageNotFound:
            pass
        base = task.docker_image
        if base is None:
            base = f"{tag}-base"
            _build(client, {"path": str(task.environment_dir), "tag": base}, task)
        elif not _present(client, base):
            raise ValidationError(
                f"{task.path}: environment.docker_image {base!r} is not on the local Docker engine (no registry is "
                "used: load or tag it first)",
                field=str(task.path),
            )
        layer = io.BytesIO(_LAYER.format(base=base).encode())
        _build(client, {"fileobj": layer, "tag": tag}, task)
        return tag
    finally:
        client.close()


def _present(client: docker.DockerClient, image: str) -> bool:
    try:
        client.images.get(image)
    except ImageNotFound:
        return False
    return True


def _build(client: docker.DockerClient, source: dict[str, object], task: TaskFolder) -> None:
    # pull=False: a FROM image must be local, never fetched; rm: no intermediate containers left behind.
    try:
        client.images.build(**source, pull=False, rm=True, forcerm=True)  # type: ignore[arg-type]
    except BuildError as exc:
        log = "".join(str(chunk.get("stream") or chunk.get("error") or "") for chunk in exc.build_log)
        raise ValidationError(
            f"{task.path}: its environment does not build: {exc.msg}\n{log[-2000:]}", field=str(task.path)
        ) from exc
    except DockerException as exc:
        raise RuntimeFailure(f"cannot build {task.name}'s environment: {exc}") from exc


def image_workdir(image: str) -> str | None:
    """The working directory ``image`` declares (its Dockerfile's last WORKDIR), or None when it declares none."""
    try:
        client = docker.from_env()
        try:
            workdir = client.images.get(image).attrs.get("Config", {}).get("WorkingDir") or ""
        finally:
            client.close()
    except DockerException as exc:
        raise RuntimeFailure(f"cannot inspect image {image}: {exc}") from exc
    return workdir if workdir not in ("", "/") else None
