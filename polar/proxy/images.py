"""The bounds on a call's images, and the engine's image token.

A call's images (``ClientRequest.options["images"]``, ``polar.protocols.images``) are checked before the engine is
asked and before anything is stored: each image's bytes and pixels, how many the call carries (its whole
conversation: an agent resends its screenshots), how many different ones its session has sent, and whether it sent
a URL (off unless ``POLAR_IMAGE_URLS``: the engine would fetch it, and a sandboxed policy must not make Polar's
engines fetch for it). Each refusal is a 400 in the caller's protocol naming the bound.

The spans of a call's images (``polar.storage.media.media_entries``) need the id of the image token the engine's
processor expands each image into. It is ``POLAR_IMAGE_TOKEN_ID`` when set, else learned from the engine once per
engine and model: its ``/tokenize`` of the same message with and without a small image differs by that one id
(however many times the image is expanded into it: vLLM 0.32's ``/tokenize`` expands it as its answers do).
"""

from __future__ import annotations

import base64
import functools
import io
import threading
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from polar.config import Config
from polar.errors import ValidationError
from polar.storage.database import Database
from polar.storage.media import StoredImage, session_images


def check_call(images: Sequence[Any], config: Config) -> None:
    """Refuse a call whose images are over a bound, or that sends a URL where URLs are not allowed."""
    if len(images) > config.max_images_per_call:
        raise ValidationError(
            f"images: {len(images)} in this request, over the limit of {config.max_images_per_call} per request "
            "(max_images_per_call)",
            field="images",
        )
    for position, image in enumerate(images):
        if image.url is not None and not config.image_urls:
            raise ValidationError(
                f"images[{position}]: image URLs are not fetched here (image_urls is off); send the image's bytes "
                "as base64 instead",
                field="images",
            )
        if image.data is not None and len(image.data) > config.max_image_bytes:
            raise ValidationError(
                f"images[{position}]: {len(image.data):,} bytes, over the limit of {config.max_image_bytes:,} "
                "(max_image_bytes)",
                field="images",
            )
        pixels = (image.width or 0) * (image.height or 0)
        if pixels > config.max_image_pixels:
            raise ValidationError(
                f"images[{position}]: {image.width}x{image.height} is {pixels:,} pixels, over the limit of "
                f"{config.max_image_pixels:,} (max_image_pixels)",
                field="images",
            )


def check_session(db: Database, session_id: uuid.UUID, images: Sequence[Any], limit: int) -> None:
    """Refuse a call that would take its session past ``limit`` different images."""
    shas = {image.sha256 for image in images if image.sha256 is not None}
    if not shas:
        return
    with db.engine.connect() as connection:
        total = len(session_images(connection, session_id) | shas)
    if total > limit:
        raise ValidationError(
            f"images: this request would bring its session to {total} different images, over the limit of {limit} "
            "per session (max_images_per_session)",
            field="images",
        )


def stored_images(images: Sequence[Any]) -> list[StoredImage]:
    """The images of a call that carry bytes, as the media table stores them (one per sha256)."""
    unique = {image.sha256: image for image in images if image.sha256 is not None and image.data is not None}
    return [StoredImage(i.sha256, i.media_type, i.data, i.width, i.height) for i in unique.values()]


@functools.cache
def probe_image() -> str:
    """A small PNG as a data URL (28x28, mid grey): what the image token is learned with."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (28, 28), (128, 128, 128)).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def probe_bodies() -> tuple[dict[str, Any], dict[str, Any]]:
    """The two ``/tokenize`` bodies whose ids differ by the image placeholder."""
    text = {"type": "text", "text": "Look."}
    image = {"type": "image_url", "image_url": {"url": probe_image()}}
    plain = {"messages": [{"role": "user", "content": [text]}]}
    with_image = {"messages": [{"role": "user", "content": [image, text]}]}
    return plain, with_image


def placeholder_of(plain: Sequence[int], with_image: Sequence[int]) -> int | None:
    """The one id ``with_image`` holds that ``plain`` does not, or None when that is not exactly one id."""
    new = set(with_image) - set(plain)
    return next(iter(new)) if len(new) == 1 else None


class ImageTokens:
    """The image token of each engine and model, learned once (``tokenize(body) -> ids`` asks the engine)."""

    def __init__(self, config: Config) -> None:
        self._fixed = config.image_token_id
        self._known: dict[tuple[str, str | None], int | None] = {}
        self._lock = threading.Lock()

    def of(self, engine: str, model: str | None, tokenize: Callable[[dict[str, Any]], list[int] | None]) -> int | None:
        if self._fixed is not None:
            return self._fixed
        key = (engine, model)
        with self._lock:
            if key in self._known:
                return self._known[key]
        plain_body, image_body = probe_bodies()
        plain, with_image = tokenize(plain_body), tokenize(image_body)
        found = None if plain is None or with_image is None else placeholder_of(plain, with_image)
        if plain is not None and with_image is not None:  # an engine that could not answer is asked again later
            with self._lock:
                self._known[key] = found
        return found
