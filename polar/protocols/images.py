"""Images in client requests, as every protocol normalises them (issue 58).

An image in the normalised request (``ClientRequest.engine_body``, an OpenAI chat body) is a chat content part

    {"type": "image_url", "image_url": {"url": "data:<media type>;base64,<b64>", "detail"?: "auto" | "low" | "high"}}

and ``ClientRequest.options["images"]`` lists one ``ImageInput`` per such part, in the order the parts appear in
``engine_body["messages"]``. Bytes are checked here (strict base64, a PNG/JPEG/GIF/WEBP by their magic that agrees
with the declared type, readable by Pillow); size, count and URL policy are the proxy service's, not checked here.

A protocol collects ``(part, image)`` pairs while it builds its messages (``from_url``, ``from_base64``,
``from_uri``) and calls ``placed`` on the finished messages: merging and moving messages (tool-result images go to
a user message after the turn's tool messages) make an index known only once the list is final.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from polar.errors import ValidationError

MEDIA_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")
ALIASES = {"image/jpg": "image/jpeg"}  # sent by some clients (and accepted by OpenAI) for JPEG
DETAILS = frozenset({"auto", "low", "high"})  # what vLLM takes; Codex's "original" and others are dropped
UNPLACED = -1  # message_index of an image whose message is not final yet (``placed`` sets it)
_PILLOW_FORMATS = ("PNG", "JPEG", "GIF", "WEBP")


@dataclass(frozen=True)
class ImageInput:
    sha256: str | None  # hex of the decoded bytes; None for a URL image
    media_type: str  # image/png | image/jpeg | image/gif | image/webp (from the bytes' magic); "" for an unknown URL
    data: bytes | None  # decoded bytes; None for a URL image
    width: int | None
    height: int | None
    message_index: int  # index in engine_body["messages"] of the message holding it
    source: str  # "user" | "tool_result"
    url: str | None = None  # an http(s)/file URL the client sent instead of bytes


Found = list[tuple[dict[str, Any], ImageInput]]  # (chat part, its image) as a protocol meets them


def _fail(field: str, message: str) -> ValidationError:
    return ValidationError(f"{field}: {message}", field=field)


def sniffed_type(data: bytes) -> str | None:
    """The media type the bytes' magic says (PNG, JPEG, GIF, WEBP), else None."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "image/gif"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return None


def normal_media_type(declared: str) -> str:
    """``Image/JPG; q=1`` → ``image/jpeg``: lower case, without parameters, aliases resolved."""
    kind = declared.split(";", 1)[0].strip().lower()
    return ALIASES.get(kind, kind)


def _decoded(encoded: str, field: str, urlsafe: bool) -> bytes:
    text = encoded
    if urlsafe:
        # Google's JSON (proto3) takes standard or URL-safe base64, padded or not; google-genai sends URL-safe.
        text = text.replace("-", "+").replace("_", "/")
        text += "=" * (-len(text) % 4)
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:  # ValueError: text that is not ASCII
        raise _fail(field, f"not valid base64 ({exc})") from exc


def _dimensions(data: bytes, field: str) -> tuple[int, int]:
    # Imported here: only requests with images need Pillow, and a text-only proxy runs without it.
    from PIL import Image

    try:
        # open() reads the header only; the pixels are never decoded here.
        with Image.open(io.BytesIO(data), formats=_PILLOW_FORMATS) as image:
            width, height = image.size
    except Exception as exc:  # Pillow raises many kinds for a bad file (OSError, SyntaxError, struct.error, ...)
        # Pillow's own words name its buffer object (``<_io.BytesIO object at 0x…>``): say what failed instead.
        raise _fail(field, f"the image cannot be read ({type(exc).__name__}: a damaged or truncated file)") from exc
    return int(width), int(height)


def decode_image(
    encoded: Any, declared: Any, field: str, message_index: int, source: str, *, urlsafe: bool = False
) -> ImageInput:
    """An image sent as base64 text, checked: ``field`` (the JSON path of the data) names any failure.

    ``declared`` is the media type the client gave (None: take the bytes' own); ``urlsafe`` also accepts URL-safe
    and unpadded base64 (Gemini)."""
    if not isinstance(encoded, str) or not encoded:
        raise _fail(field, "required, the image as base64 text")
    if declared is not None and not isinstance(declared, str):
        raise _fail(field, "the media type must be a string")
    data = _decoded(encoded, field, urlsafe)
    actual = sniffed_type(data)
    if actual is None:
        raise _fail(field, "not a PNG, JPEG, GIF or WEBP image")
    if declared and normal_media_type(declared) != actual:
        raise _fail(field, f"declared as {declared} but the bytes are {actual}")
    width, height = _dimensions(data, field)
    return ImageInput(hashlib.sha256(data).hexdigest(), actual, data, width, height, message_index, source)


def parse_data_url(url: str, field: str) -> tuple[str | None, str]:
    """(declared media type or None, base64 text) of ``data:<type>[;params];base64,<data>``."""
    head, comma, data = url.partition(",")
    if not comma or head[:5].lower() != "data:":
        raise _fail(field, "a data URL must read data:<media type>;base64,<data>")
    params = head[5:].split(";")
    if len(params) < 2 or params[-1].strip().lower() != "base64":
        raise _fail(field, "only base64 data URLs are supported (data:<media type>;base64,<data>)")
    return params[0].strip() or None, data


def data_url(image: ImageInput) -> str:
    """The image as the data URL the engine gets: its own media type and standard, padded base64."""
    assert image.data is not None
    return f"data:{image.media_type};base64,{base64.b64encode(image.data).decode('ascii')}"


def image_part(url: str, detail: Any = None) -> dict[str, Any]:
    """The chat content part for an image; ``detail`` only when vLLM knows it (auto, low, high)."""
    image_url: dict[str, Any] = {"url": url}
    if isinstance(detail, str) and detail in DETAILS:
        image_url["detail"] = detail
    return {"type": "image_url", "image_url": image_url}


def url_image(url: str, media_type: str | None, message_index: int, source: str) -> ImageInput:
    """An image the client sent as a URL: no bytes here (whether URLs are allowed is the proxy's decision)."""
    kind = normal_media_type(media_type) if media_type else ""
    return ImageInput(None, kind, None, None, None, message_index, source, url)


def from_base64(
    encoded: Any, declared: Any, field: str, source: str, *, urlsafe: bool = False
) -> tuple[dict[str, Any], ImageInput]:
    """(chat part, image) for base64 text (Anthropic's ``source.data``, Gemini's ``inlineData.data``)."""
    image = decode_image(encoded, declared, field, UNPLACED, source, urlsafe=urlsafe)
    return image_part(data_url(image)), image


def from_url(url: Any, field: str, source: str, detail: Any = None) -> tuple[dict[str, Any], ImageInput]:
    """(chat part, image) for a data URL or an http(s) URL (OpenAI's ``image_url``, Anthropic's url source)."""
    if not isinstance(url, str) or not url:
        raise _fail(field, "required, a data URL or an http(s) URL")
    if url[:5].lower() == "data:":
        declared, encoded = parse_data_url(url, field)
        image = decode_image(encoded, declared, field, UNPLACED, source)
        return image_part(data_url(image), detail), image
    if url.split(":", 1)[0].lower() in ("http", "https"):
        return image_part(url, detail), url_image(url, None, UNPLACED, source)
    raise _fail(field, "must be a data URL (data:<media type>;base64,<data>) or an http(s) URL")


def from_uri(uri: Any, media_type: Any, field: str, source: str) -> tuple[dict[str, Any], ImageInput]:
    """(chat part, image) for a file URI with an optional media type (Gemini's ``fileData``): any scheme (gs://,
    https://, the Files API's), left to the proxy; a media type that is no image is refused."""
    if not isinstance(uri, str) or not uri:
        raise _fail(field, "required, a URI")
    if media_type is not None and not isinstance(media_type, str):
        raise _fail(field, "the media type must be a string")
    if media_type and normal_media_type(media_type) not in MEDIA_TYPES:
        raise _fail(field, f"{media_type} is not supported by this model (PNG, JPEG, GIF or WEBP images only)")
    return image_part(uri), url_image(uri, media_type, UNPLACED, source)


def content(pieces: Sequence[str | dict[str, Any]]) -> str | list[dict[str, Any]]:
    """A message's content from texts and image parts in order: the texts joined by newlines when there is no
    image (as before images were taken), else parts with adjacent texts joined the same way."""
    if all(isinstance(piece, str) for piece in pieces):
        return "\n".join(pieces)  # type: ignore[arg-type]
    parts: list[dict[str, Any]] = []
    texts: list[str] = []
    for piece in pieces:
        if isinstance(piece, str):
            texts.append(piece)
            continue
        if texts:
            parts.append({"type": "text", "text": "\n".join(texts)})
            texts = []
        parts.append(piece)
    if texts:
        parts.append({"type": "text", "text": "\n".join(texts)})
    return parts


def placed(messages: Sequence[Mapping[str, Any]], found: Found) -> tuple[ImageInput, ...]:
    """The images of ``found`` with the index of the message holding each part, in the messages' order.

    Parts are matched by identity: they are the dicts the protocol put in the messages, so two equal images (the
    same screenshot twice) stay two entries."""
    if not found:
        return ()
    by_part = {id(part): image for part, image in found}
    result = []
    for index, message in enumerate(messages):
        parts = message.get("content")
        if not isinstance(parts, list):
            continue
        for part in parts:
            image = by_part.get(id(part))
            if image is not None:
                result.append(replace(image, message_index=index))
    if len(result) != len(found):  # a protocol dropped or copied a part after finding it: a bug, not the client's
        raise RuntimeError(f"{len(found)} images found but {len(result)} placed in the messages")
    return tuple(result)
