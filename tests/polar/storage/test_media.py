"""Images stored once (``polar.storage.media``): payloads hold references that restore to exactly the base64 they
replaced, each image's bytes are one row however many calls send it, spans pair with the image token's runs, and
``delete_unreferenced`` keeps what a call or trajectory still names."""

from __future__ import annotations

import base64
import hashlib
import io
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

from polar.protocols.images import ImageInput
from polar.services import Services
from polar.storage import media
from polar.storage.calls.write import CallRecord, record_call
from polar.storage.models import MediaObject, ModelCall
from tests.polar.storage.test_prompts import running_session
from tests.stage_calls import domain_services


def png(colour: tuple[int, int, int], size: tuple[int, int] = (28, 28)) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", size, colour).save(buffer, format="PNG")
    return buffer.getvalue()


def stored(data: bytes) -> media.StoredImage:
    return media.StoredImage(hashlib.sha256(data).hexdigest(), "image/png", data, 28, 28)


def image_input(data: bytes, message_index: int = 0, source: str = "user") -> ImageInput:
    return ImageInput(hashlib.sha256(data).hexdigest(), "image/png", data, 28, 28, message_index, source)


RED, BLUE = png((255, 0, 0)), png((0, 0, 255))


@pytest.fixture
def services(database_url: str, tmp_path: Path) -> Iterator[Services]:
    services = domain_services(database_url, tmp_path)
    yield services
    services.db.dispose()


def test_references_replace_every_form_and_restore_exactly() -> None:
    red, blue = stored(RED), stored(BLUE)
    encoded = base64.b64encode(RED).decode()
    urlsafe = base64.urlsafe_b64encode(BLUE).decode().rstrip("=")
    as_png, as_jpg = f"data:image/png;base64,{encoded}", f"data:image/jpg;base64,{encoded}"
    payload = {
        "messages": [
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": as_png}},
                                         {"type": "text", "text": "what colour?"}]},
            {"role": "user", "content": [{"type": "image", "source": {"type": "base64", "data": encoded}}]},
            {"role": "user", "parts": [{"inlineData": {"mimeType": "image/png", "data": urlsafe}}]},
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": as_jpg}}]},
        ]
    }  # fmt: skip
    out = media.stripped(payload, [red, blue])
    text = str(out)
    assert encoded not in text and urlsafe not in text
    assert out["messages"][0]["content"][0]["image_url"]["url"] == f"data:image/png;polar-media,{red.sha256}"
    assert out["messages"][1]["content"][0]["source"]["data"] == f"polar-media:{red.sha256}"
    assert out["messages"][3]["content"][0]["image_url"]["url"] == f"data:image/jpg;polar-media,{red.sha256}"
    assert out["messages"][0]["content"][1] is payload["messages"][0]["content"][1]  # untouched parts are shared
    assert media.references(out) == [red.sha256, red.sha256, blue.sha256, red.sha256]
    back = media.restored(out, {red.sha256: RED, blue.sha256: BLUE})
    assert back["messages"][0] == payload["messages"][0] and back["messages"][1] == payload["messages"][1]
    assert base64.b64decode(back["messages"][2]["parts"][0]["inlineData"]["data"]) == BLUE  # standard base64 now
    assert back["messages"][3] == payload["messages"][3]
    assert media.stripped(payload, []) is payload


def test_spans_pair_with_the_image_token_runs() -> None:
    images = [image_input(RED, 1), image_input(BLUE, 3, "tool_result")]
    prompt = [1, 2, 9, 9, 9, 9, 3, 4, 9, 9, 9, 9, 5]
    entries = media.media_entries(images, prompt, 9, "tiny-vlm")
    assert [(e["offset"], e["length"], e["source"]) for e in entries] == [(2, 4, "user"), (8, 4, "tool_result")]
    assert all("unmatched" not in e for e in entries)
    # Runs and images that do not pair one to one leave the spans out rather than guess.
    unpaired = media.media_entries(images, [1, 9, 9, 9, 9, 9, 9, 9, 9, 2], 9, "tiny-vlm")
    assert [e["offset"] for e in unpaired] == [None, None] and "1 runs" in unpaired[0]["unmatched"]
    assert media.media_entries(images[:1], prompt[:6], None, None)[0]["offset"] is None


def _call(session_id: uuid.UUID, entries: list[dict[str, object]], request: dict[str, object]) -> CallRecord:
    return CallRecord(
        session_id=session_id, agent=None, provider="openai_chat", model="m", stream=False,
        prompt_token_ids=[1, 9, 9, 9, 9, 2], completion_token_ids=[3], logprobs=[-0.5], finish_reason="stop",
        status_code=200, latency_ms=1.0, engine_latency_ms=None, engine_url=None, policy_version=None,
        request=request, normalized_request=request, response={}, media=entries,
    )  # fmt: skip


def test_an_image_is_stored_once_and_collected_when_nothing_names_it(services: Services) -> None:
    session_id = running_session(services)
    store = media.MediaStore()
    red = stored(RED)
    for _ in range(3):  # three calls resending the same screenshot: one row, and one round trip
        with services.db.engine.begin() as connection:
            store.store(connection, [red])
        store.remember([red.sha256])
    assert store.unknown([red]) == []
    with services.db.engine.begin() as connection:
        assert media.MediaStore().store(connection, [red, stored(BLUE)]) == 1  # another process: only the new one
    entries = media.media_entries([image_input(RED)], [1, 9, 9, 9, 9, 2], 9, "m")
    request = media.stripped({"messages": [{"url": media.reference(red.sha256, "image/png")}]}, [red])
    record_call(services.db, _call(session_id, entries, request))
    with services.db.engine.connect() as connection:
        assert connection.scalar(sa.select(sa.func.count()).select_from(MediaObject)) == 2
        found = media.load(connection, [red.sha256, "0" * 64])
        assert list(found) == [red.sha256] and found[red.sha256].data == RED
        rows = connection.execute(sa.text('SELECT sha256, "offset", length, size FROM call_media')).all()
        assert [tuple(r) for r in rows] == [(red.sha256, 1, 4, len(RED))]
    later = datetime.now(UTC) + timedelta(minutes=1)
    with services.db.engine.begin() as connection:
        assert media.delete_unreferenced(connection, datetime.now(UTC) - timedelta(hours=1)) == (0, 0)  # too new
        assert media.delete_unreferenced(connection, later) == (1, len(BLUE))  # blue: no call names it
    with services.db.engine.begin() as connection:
        connection.execute(sa.delete(ModelCall.__table__).where(ModelCall.session_id == session_id))
        assert media.delete_unreferenced(connection, later) == (1, len(RED))
