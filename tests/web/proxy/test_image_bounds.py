"""Images the proxy refuses, in every protocol: an oversized image, one over the pixel bound, too many in one
request, too many different ones in a session, a URL where URLs are off, and bytes that are no image. Each is a 400
in the caller's own error shape naming the bound or the part, the engine is not asked, and nothing is stored: no
call, no image. One image under every bound is answered and stored once.

The proxy runs in-process (Flask's test client) against a real reference engine (its ``image_colour`` policy) and
Postgres, with small bounds so the test images stay small."""

from __future__ import annotations

import base64
import hashlib
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from polar.config import load_config
from tests.live_proxy import LiveProxy, live_proxy
from tests.web.proxy.test_bad_input import error_shape, post
from web.proxy import create_app

BOUNDS = {"POLAR_MAX_IMAGE_BYTES": "3000", "POLAR_MAX_IMAGE_PIXELS": "10000", "POLAR_MAX_IMAGES_PER_CALL": "3",
          "POLAR_MAX_IMAGES_PER_SESSION": "4"}  # fmt: skip


def png(colour: tuple[int, int, int], size: tuple[int, int] = (28, 28), noise: bool = False) -> bytes:
    from PIL import Image

    image = Image.new("RGB", size, colour)
    if noise:  # incompressible: a small image past the byte bound
        image = Image.frombytes("RGB", size, hashlib.shake_256(bytes(colour)).digest(size[0] * size[1] * 3))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def request(provider: str, images: list[bytes | str]) -> tuple[str, dict[str, Any]]:
    """The protocol's route and a body whose one user turn holds ``images`` (bytes, or a URL) and a question."""

    def url(image: bytes | str) -> str:
        return image if isinstance(image, str) else f"data:image/png;base64,{_b64(image)}"

    question = {"type": "text", "text": "Colour?"}
    if provider == "openai_chat":
        parts = [{"type": "image_url", "image_url": {"url": url(i)}} for i in images]
        messages = [{"role": "user", "content": [*parts, question]}]
        return "/v1/chat/completions", {"model": "m", "max_tokens": 8, "messages": messages}
    if provider == "openai_responses":
        parts = [{"type": "input_image", "image_url": url(i), "detail": "auto"} for i in images]
        turn = [{"role": "user", "content": [*parts, {"type": "input_text", "text": "Colour?"}]}]
        return "/v1/responses", {"model": "m", "max_output_tokens": 8, "input": turn}
    if provider == "anthropic":
        blocks = [{"type": "image", "source": {"type": "url", "url": i} if isinstance(i, str) else
                   {"type": "base64", "media_type": "image/png", "data": _b64(i)}} for i in images]  # fmt: skip
        messages = [{"role": "user", "content": [*blocks, question]}]
        return "/v1/messages", {"model": "m", "max_tokens": 8, "messages": messages}
    parts = [{"fileData": {"mimeType": "image/png", "fileUri": i}} if isinstance(i, str) else
             {"inlineData": {"mimeType": "image/png", "data": _b64(i)}} for i in images]  # fmt: skip
    return "/v1beta/models/m:generateContent", {"contents": [{"role": "user", "parts": [*parts, {"text": "Colour?"}]}]}


PROVIDERS = ("openai_chat", "openai_responses", "anthropic", "gemini")
RED, GREEN, BLUE, WHITE, BLACK = (png(c) for c in ((255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 255), (0, 0, 0)))
LARGE = png((9, 9, 9), (34, 34), noise=True)  # 3.5 kB of random pixels: past the 3,000 bytes
WIDE = png((9, 9, 9), (200, 60))  # 12,000 pixels, a few hundred bytes
REFUSALS = {
    "max_image_bytes": ([LARGE], "max_image_bytes"),
    "max_image_pixels": ([WIDE], "max_image_pixels"),
    "max_images_per_call": ([RED, GREEN, BLUE, WHITE], "max_images_per_call"),
    "image_urls": (["https://example.invalid/cat.png"], "image_urls is off"),
    "not_an_image": ([b"\x89PNG\r\n\x1a\n truncated"], "cannot be read"),  # a PNG's magic, then nothing readable
}


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory, module_database_url: str) -> Iterator[tuple[Any, LiveProxy]]:
    tmp: Path = tmp_path_factory.mktemp("image-bounds")
    with live_proxy(module_database_url, tmp, policy="image_colour") as live:
        env = {"POLAR_DATABASE_URL": module_database_url, "POLAR_ENGINE_URLS": live.engine_url, **BOUNDS}
        yield create_app(load_config(env, cwd=tmp)).test_client(), live


def stored(live: LiveProxy, session_id: Any, images: list[bytes | str]) -> tuple[int, int]:
    """The session's calls, and how many of ``images`` the media table holds."""
    shas = [hashlib.sha256(i).hexdigest() for i in images if isinstance(i, bytes)]
    with live.services.db.engine.connect() as connection:
        calls = connection.scalar(sa.text("SELECT count(*) FROM model_calls WHERE session_id = :s"), {"s": session_id})
        held = connection.scalar(sa.text("SELECT count(*) FROM media_objects WHERE sha256 = ANY(:s)"), {"s": shas})
    return int(calls or 0), int(held or 0)


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("bound", sorted(REFUSALS))
def test_an_image_over_a_bound_is_a_400_in_the_callers_protocol_and_nothing_is_stored(
    proxy: tuple[Any, LiveProxy], provider: str, bound: str
) -> None:
    client, live = proxy
    session_id, key = live.session()
    images, words = REFUSALS[bound]
    path, body = request(provider, images)
    refused = post(client, key, path, body)
    assert refused.status_code == 400, refused.get_data()[:300]
    assert error_shape(refused.json) == {"openai_chat": "openai", "openai_responses": "openai"}.get(provider, provider)
    assert words in json.dumps(refused.json), refused.json
    assert stored(live, session_id, images) == (0, 0)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_session_past_its_different_images_is_refused_and_one_under_every_bound_is_stored_once(
    proxy: tuple[Any, LiveProxy], provider: str
) -> None:
    client, live = proxy
    session_id, key = live.session()
    for images in ([RED, GREEN], [RED, GREEN, BLUE], [BLUE, WHITE]):  # 2, 3, then 4 different: all answered
        answered = post(client, key, *request(provider, images))
        assert answered.status_code == 200, answered.get_data()[:300]
    assert stored(live, session_id, [RED, GREEN, BLUE, WHITE]) == (3, 4)
    refused = post(client, key, *request(provider, [WHITE, BLACK]))  # a fifth different image
    assert refused.status_code == 400 and "max_images_per_session" in json.dumps(refused.json)
    assert stored(live, session_id, [BLACK]) == (3, 0)
