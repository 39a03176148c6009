"""Images in chat messages, as the reference engine and its tiny VLM read them.

    IMAGE_TOKEN, IMAGE_TOKEN_ID, IMAGE_TOKENS      # "<image>", 8192, 4: the one home of these constants

A chat content part ``{"type": "image_url", "image_url": {"url": "data:image/png;base64,…", "detail"?}}`` becomes an
``ImagePart`` of its message: the message's ``content`` keeps its text only (policies read text), and the part records
where in that text it sits. The chat template writes ``IMAGE_TOKEN`` there (``with_placeholders``); the tokenizer
makes each placeholder the one id ``IMAGE_TOKEN_ID``, outside the BPE vocabulary (``Tokenizer.encode_images``), and a
prompt's ids carry ``IMAGE_TOKENS`` of them per image (``expand_image_ids``), as vLLM's processor expands a CLIP
tower's 2x2 patches. ``/tokenize`` of messages answers the expanded ids, as vLLM 0.32's does (measured: the ids
its chat answer reports).

Pixels are read only where needed (``load_image``, Pillow imported then): the proxy and the reconstruction code
normalise messages without decoding their images.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from polar.chat.errors import MessageFormatError

if TYPE_CHECKING:
    from PIL.Image import Image

IMAGE_TOKEN = "<image>"
IMAGE_TOKEN_ID = 8192  # the reference tokenizer's VOCAB_SIZE: one past its last BPE id, so no text id moves
IMAGE_TOKENS = 4  # ids per image in a prompt: a CLIP tower at 28 px with 14 px patches, CLS dropped
IMAGE_PART_TYPES = ("image_url",)
DETAILS = ("auto", "low", "high")
# What vLLM's media connector accepts; the reference engine itself reads data URLs only (it fetches nothing).
_URL_SCHEMES = ("data:", "http://", "https://", "file:")
_LOADED = 64  # decoded images kept: an agent resends its whole conversation's images every turn
_KEPT_SIDE = 512  # the most pixels a side that a kept image holds


@dataclass(frozen=True)
class ImagePart:
    """One image of a message: its URL (None for a placeholder read back from token ids, which has no pixels),
    the client's ``detail`` and the character offset in the message's text content where it sits."""

    url: str | None
    offset: int
    detail: str | None = None


@dataclass(frozen=True)
class LoadedImage:
    """An image as policies see it: its size, its mean colour and its pixels (RGB, reduced to at most 512 px a side).
    Shared between requests: never modify ``pixels``."""

    pixels: Image = field(repr=False, compare=False)
    width: int
    height: int
    mean_rgb: tuple[float, float, float]


_KEPT: OrderedDict[bytes, LoadedImage] = OrderedDict()  # by the SHA-256 of the URL, most recent last
_LOCK = threading.Lock()


def image_part(part: dict[str, Any], where: str, offset: int) -> ImagePart:
    """The ``ImagePart`` of an ``image_url`` content part; MessageFormatError when it is malformed."""
    image_url = part.get("image_url")
    if not isinstance(image_url, dict):
        image_url = {}
    url = image_url.get("url")
    if not isinstance(url, str) or not url.startswith(_URL_SCHEMES):
        raise MessageFormatError(
            f"{where}.content image_url part needs image_url.url, a data: or http(s) URL", param="messages"
        )
    detail = image_url.get("detail")
    if detail is not None and detail not in DETAILS:
        raise MessageFormatError(f"{where}.content image_url.detail must be one of {', '.join(DETAILS)}",
                                 param="messages")  # fmt: skip
    return ImagePart(url, offset, detail)


def with_placeholders(text: str, images: Sequence[ImagePart]) -> str:
    """``text`` with ``IMAGE_TOKEN`` written at each image's offset: what the chat template renders."""
    if not images:
        return text
    pieces: list[str] = []
    start = 0
    for image in images:
        pieces += [text[start : image.offset], IMAGE_TOKEN]
        start = image.offset
    pieces.append(text[start:])
    return "".join(pieces)


def split_placeholders(text: str) -> tuple[str, tuple[ImagePart, ...]]:
    """The inverse of ``with_placeholders`` for text decoded from token ids: each run of placeholders (expanded,
    ``IMAGE_TOKENS`` to an image, or not) becomes image parts without pixels."""
    if IMAGE_TOKEN not in text:
        return text, ()
    pieces = text.split(IMAGE_TOKEN)
    kept = pieces[0]
    images: list[ImagePart] = []
    run = 0
    for index, piece in enumerate(pieces[1:], start=2):
        run += 1
        if piece or index == len(pieces):
            images += [ImagePart(None, len(kept))] * -(-run // IMAGE_TOKENS)
            kept += piece
            run = 0
    return kept, tuple(images)


def expand_image_ids(ids: Sequence[int]) -> list[int]:
    """Each ``IMAGE_TOKEN_ID`` as ``IMAGE_TOKENS`` of them, in place (the prompt ids vLLM reports)."""
    out: list[int] = []
    for token_id in ids:
        if token_id == IMAGE_TOKEN_ID:
            out += [IMAGE_TOKEN_ID] * IMAGE_TOKENS
        else:
            out.append(token_id)
    return out


def load_image(part: ImagePart, where: str = "messages") -> LoadedImage:
    """The pixels of an image part; MessageFormatError (a 400 in vLLM's shape) when it is not a base64 data URL of
    an image Pillow can read."""
    if part.url is None:
        raise MessageFormatError(f"{where}: this image has no pixels (it came as token ids)", param="messages")
    if not part.url.startswith("data:"):
        raise MessageFormatError(
            f"{where}: the reference engine fetches no image URLs; send the image as a base64 data: URL",
            param="messages",
        )
    key = hashlib.sha256(part.url.encode("utf-8", "surrogatepass")).digest()  # the cache keeps no URLs
    with _LOCK:
        if key in _KEPT:
            _KEPT.move_to_end(key)
            return _KEPT[key]
    try:
        loaded = _decode_data_url(part.url)
    except ValueError as exc:
        raise MessageFormatError(f"{where}: {exc}", param="messages") from exc
    with _LOCK:
        _KEPT[key] = loaded
        while len(_KEPT) > _LOADED:
            _KEPT.popitem(last=False)
    return loaded


def _decode_data_url(url: str) -> LoadedImage:
    """ValueError naming what is wrong with the URL or its image."""
    header, comma, payload = url.partition(",")
    if not comma or not header.endswith(";base64"):
        raise ValueError("only base64 data URLs are supported (data:<media type>;base64,<data>)")
    try:
        data = base64.b64decode(payload, validate=True)
    except binascii.Error as exc:
        raise ValueError(f"the image's base64 data is malformed: {exc}") from exc
    from PIL import Image, ImageStat, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as opened:
            rgb = opened.convert("RGB")  # convert() reads every pixel: a truncated file fails here, not later
    except (UnidentifiedImageError, OSError, Image.DecompressionBombError) as exc:
        raise ValueError(f"the image cannot be decoded: {exc}") from exc
    red, green, blue = ImageStat.Stat(rgb).mean
    width, height = rgb.size
    rgb.thumbnail((_KEPT_SIDE, _KEPT_SIDE))  # the cache keeps no full-size screenshots
    return LoadedImage(rgb, width, height, (red, green, blue))
