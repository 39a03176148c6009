"""Images stored once: ``media_objects`` (this module owns the table) and the references captured payloads hold.

An agent resends its whole conversation on every call, screenshots included: a session of 50 calls with one new
screenshot each would store 1,275 copies of them in its payloads. Instead each image's bytes are stored once per
deployment under their sha256 (with media type, size and dimensions), and the stored request and normalised request
hold a reference in place of each image's base64:

    data:image/png;base64,iVBORw0…   →   data:image/png;polar-media,<sha256>     (a data URL)
    iVBORw0…                         →   polar-media:<sha256>                    (bare base64: Anthropic, Gemini)

so the payload deltas (``polar.storage.payloads``) never repeat an image an earlier call sent. ``restored`` puts the
bytes back (the SFT export, the console). Each call's row lists its images (``media_entries``) with the span each
covers in its expanded prompt ids: a vision model's processor replaces an image's one placeholder with one image
token per vision embedding, and the engine reports those expanded ids.
"""

from __future__ import annotations

import base64
import re
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from polar.storage.models import MediaObject, ModelCall, Trajectory

BARE_PREFIX = "polar-media:"
_DATA_URL_REFERENCE = re.compile(r"data:([^,]*);polar-media,([0-9a-f]{64})")
_BARE_REFERENCE = re.compile(r"polar-media:([0-9a-f]{64})")
_media = MediaObject.__table__
KNOWN_STORED = 4096  # sha256s a process remembers as stored (a hit saves a round trip carrying no bytes)


@dataclass(frozen=True)
class StoredImage:
    """What the table holds of one image."""

    sha256: str
    media_type: str
    data: bytes
    width: int | None = None
    height: int | None = None


def reference(sha256: str, media_type: str | None = None) -> str:
    """The text a stored payload holds in place of an image: a data URL's (``media_type`` given) or bare base64's."""
    return f"data:{media_type};polar-media,{sha256}" if media_type is not None else f"{BARE_PREFIX}{sha256}"


def stripped(payload: Any, images: Iterable[StoredImage]) -> Any:
    """``payload`` with every string that carries one of ``images`` (its data URL or its bare base64) replaced by
    the image's reference. New containers only along the paths that change; ``payload`` stays as it is."""
    by_text: dict[str, str] = {}
    for image in images:
        encoded = base64.b64encode(image.data).decode("ascii")
        # Google's JSON takes URL-safe base64, padded or not (google-genai sends it so): the same image.
        urlsafe = base64.urlsafe_b64encode(image.data).decode("ascii")
        for variant in (encoded, encoded.rstrip("="), urlsafe, urlsafe.rstrip("=")):
            by_text[variant] = reference(image.sha256)
        by_text[f"data:{image.media_type};base64,{encoded}"] = reference(image.sha256, image.media_type)
    if not by_text:
        return payload
    shortest = min(len(text) for text in by_text)

    def walk(value: Any) -> Any:
        if isinstance(value, str):
            if len(value) < shortest:
                return value
            found = by_text.get(value)
            if found is None and value.startswith("data:"):  # a data URL of another declared type, or with params
                head, _, data = value.partition(",")
                bare = by_text.get(data) if head.endswith(";base64") else None
                sha = None if bare is None else bare.removeprefix(BARE_PREFIX)
                found = None if sha is None else f"{head.removesuffix(';base64')};polar-media,{sha}"
            return value if found is None else found
        if isinstance(value, dict):
            changed = {key: walk(item) for key, item in value.items()}
            return value if all(changed[k] is value[k] for k in value) else changed
        if isinstance(value, list):
            items = [walk(item) for item in value]
            return value if all(a is b for a, b in zip(items, value, strict=True)) else items
        return value

    return walk(payload)


def referenced(payload: Any) -> set[str]:
    """The sha256s a stored payload refers to."""
    return set(references(payload))


def references(payload: Any) -> list[str]:
    """The sha256s a stored payload refers to, in order, an image sent twice twice."""
    found: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, str) and "polar-media" in value:
            match = _DATA_URL_REFERENCE.fullmatch(value) or _BARE_REFERENCE.fullmatch(value)
            if match is not None:
                found.append(match[match.lastindex or 1])
        elif isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk(payload)
    return found


def restored(payload: Any, data_of: Mapping[str, bytes]) -> Any:
    """A stored payload with its references replaced by the images' base64 again (``data_of``: bytes by sha256; a
    reference to an image not in it stays as it is)."""

    def text(value: str) -> str:
        match = _DATA_URL_REFERENCE.fullmatch(value)
        if match is not None and match[2] in data_of:
            return f"data:{match[1]};base64,{base64.b64encode(data_of[match[2]]).decode('ascii')}"
        match = _BARE_REFERENCE.fullmatch(value)
        if match is not None and match[1] in data_of:
            return base64.b64encode(data_of[match[1]]).decode("ascii")
        return value

    def walk(value: Any) -> Any:
        if isinstance(value, str):
            return text(value) if "polar-media" in value else value
        if isinstance(value, dict):
            return {key: walk(item) for key, item in value.items()}
        if isinstance(value, list):
            return [walk(item) for item in value]
        return value

    return walk(payload)


def image_runs(prompt_ids: Sequence[int], token_id: int) -> list[tuple[int, int]]:
    """The runs of ``token_id`` in ``prompt_ids``: (offset, length) each, in order."""
    runs: list[tuple[int, int]] = []
    start = None
    for position, token in enumerate(prompt_ids):
        if token == token_id:
            if start is None:
                start = position
        elif start is not None:
            runs.append((start, position - start))
            start = None
    if start is not None:
        runs.append((start, len(prompt_ids) - start))
    return runs


def media_entries(
    images: Sequence[Any], prompt_ids: Sequence[int], token_id: int | None, model: str | None
) -> list[dict[str, Any]]:
    """A call's ``media`` column: one entry per image of its request (``polar.protocols.images.ImageInput``, in
    prompt order), with the span it covers in ``prompt_ids``: the k-th run of the image token is the k-th image.
    When the runs and the images do not pair up one to one (no image token known, an engine that answered without
    expanding, two images whose runs touch), the spans are left out (``offset`` and ``length`` null) and the entry
    says ``unmatched``: a wrong span would be worse than none."""
    runs = image_runs(prompt_ids, token_id) if token_id is not None else []
    paired = len(runs) == len(images)
    entries = []
    for position, image in enumerate(images):
        offset, length = runs[position] if paired else (None, None)
        entry = {
            "sha256": image.sha256, "media_type": image.media_type, "message_index": image.message_index,
            "source": image.source, "offset": offset, "length": length, "width": image.width,
            "height": image.height, "image_token_id": token_id, "model": model,
        }  # fmt: skip
        if image.sha256 is None:
            entry["url"] = image.url
        if not paired:
            entry["unmatched"] = f"{len(runs)} runs of the image token for {len(images)} images"
        entries.append(entry)
    return entries


class MediaStore:
    """Writes images once: a process remembers which sha256s it has seen stored, so a conversation resending its
    screenshots costs no round trip for them after the first. Thread-safe."""

    def __init__(self, known: int = KNOWN_STORED) -> None:
        self._known: OrderedDict[str, None] = OrderedDict()
        self._size = known
        self._lock = threading.Lock()

    def unknown(self, images: Iterable[StoredImage]) -> list[StoredImage]:
        with self._lock:
            fresh = {image.sha256: image for image in images if image.sha256 not in self._known}
        return list(fresh.values())

    def store(self, connection: sa.Connection, images: Sequence[StoredImage]) -> int:
        """Insert those of ``images`` the table lacks (on ``connection``, committed by its caller, who then
        ``remember``s them): how many."""
        fresh = self.unknown(images)
        if not fresh:
            return 0
        present = set(
            connection.scalars(sa.select(_media.c.sha256).where(_media.c.sha256.in_([i.sha256 for i in fresh])))
        )
        missing = [image for image in fresh if image.sha256 not in present]
        if missing:
            rows = [
                {"sha256": i.sha256, "media_type": i.media_type, "size": len(i.data), "width": i.width,
                 "height": i.height, "data": i.data}
                for i in missing
            ]  # fmt: skip
            if connection.dialect.name == "postgresql":  # a concurrent call may store the same image first
                connection.execute(postgresql.insert(_media).on_conflict_do_nothing(index_elements=["sha256"]), rows)
            else:
                connection.execute(sa.insert(_media).prefix_with("OR IGNORE"), rows)
        return len(missing)

    def remember(self, shas: Iterable[str]) -> None:
        with self._lock:
            for sha in shas:
                self._known[sha] = None
                self._known.move_to_end(sha)
            while len(self._known) > self._size:
                self._known.popitem(last=False)


def load(connection: sa.Connection, shas: Iterable[str]) -> dict[str, StoredImage]:
    """The stored images of ``shas`` (those the table holds)."""
    wanted = sorted(set(shas))
    if not wanted:
        return {}
    rows = connection.execute(sa.select(_media).where(_media.c.sha256.in_(wanted)))
    return {r.sha256: StoredImage(r.sha256, r.media_type, bytes(r.data), r.width, r.height) for r in rows}


def data_of(connection: sa.Connection, payloads: Iterable[Any]) -> dict[str, bytes]:
    """The bytes of every image ``payloads`` refer to, for ``restored``."""
    shas: set[str] = set()
    for payload in payloads:
        shas |= referenced(payload)
    return {sha: image.data for sha, image in load(connection, shas).items()}


def session_images(connection: sa.Connection, session_id: Any) -> set[str]:
    """The sha256s of the images a session's calls have sent (Postgres; none known on SQLite)."""
    if connection.dialect.name != "postgresql":
        return set()
    calls = ModelCall.__table__
    element = sa.func.jsonb_array_elements(calls.c.media).table_valued("value")
    seen = (
        sa.select(element.c.value.op("->>")("sha256"))
        .select_from(calls)
        .join(element, sa.true())
        .where(calls.c.session_id == session_id, calls.c.media.is_not(None))
        .distinct()
    )
    return {sha for sha in connection.scalars(seen) if sha is not None}


def _used(column: sa.ColumnElement[Any], table: Any) -> sa.Select[Any]:
    element = sa.func.jsonb_array_elements(column).table_valued("value")
    return (
        sa.select(element.c.value.op("->>")("sha256"))
        .select_from(table)
        .join(element, sa.true())
        .where(column.is_not(None))
    )


def delete_unreferenced(connection: sa.Connection, created_before: datetime) -> tuple[int, int]:
    """Delete the images no call and no trajectory refers to any more, stored before ``created_before`` (an image
    stored just now may belong to a call being recorded): how many, and their bytes (Postgres)."""
    used = sa.union(_used(ModelCall.__table__.c.media, ModelCall.__table__),
                    _used(Trajectory.__table__.c.media, Trajectory.__table__)).subquery()  # fmt: skip
    doomed = sa.and_(_media.c.created_at < created_before, _media.c.sha256.not_in(sa.select(used.c[0])))
    totals = sa.select(sa.func.count(), sa.func.coalesce(sa.func.sum(_media.c.size), 0)).where(doomed)
    count, size = connection.execute(totals).one()
    if count:
        connection.execute(sa.delete(_media).where(doomed))
    return int(count), int(size)
