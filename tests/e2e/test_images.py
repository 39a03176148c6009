"""A batch that asks about pictures, end to end on the shared stack (gunicorn API and proxy, Celery stage workers,
Postgres, the reference engine's ``image_colour`` policy): 20 tasks, each with a flat-colour image as a data URL
in its ``images`` (copied into the work directory), sent by ``polar.agents.looking`` as a chat ``image_url`` part.
Every session completes scored by the colour named; each image is stored once, its call and trajectory carry its
span (4 image tokens where it stands), the RL export's rows carry the spans, and ``GET /v1/media/{sha256}`` gives
the bytes to the read-only token and 401 to no token. The console's call page shows the image (in Chromium). A
submitted image that is no image is a 400."""

from __future__ import annotations

import base64
import hashlib
import io
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from polar.chat.images import IMAGE_TOKEN_ID, IMAGE_TOKENS
from polar.client import APIError, PolarClient
from polar.refengine.policies.image_colour import PALETTE
from tests.browser import Browser, chromium_path
from tests.shared_stack import READ_TOKEN, routed
from tests.stacks import RunningStack

COLOURS = ["red", "green", "blue", "yellow", "white"]
TASKS = 20


def png(colour: tuple[int, int, int], size: tuple[int, int]) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", size, colour).save(buffer, format="PNG")
    return buffer.getvalue()


def task(index: int) -> dict[str, Any]:
    colour = COLOURS[index % len(COLOURS)]
    image = png(PALETTE[colour], (28 + index, 28))  # a different image per task, the colour every fifth
    return {
        "task_id": f"colour-{index:02d}",
        "instruction": routed("image_colour", "What colour is the image? Answer with one word."),
        "timeout_seconds": 120,
        "reconstruction": "prefix_merging",
        "images": [f"data:image/png;base64,{base64.b64encode(image).decode()}"],
        "harness": {"name": "python", "command": "polar.agents.looking:run"},
        "evaluator": {"name": "test_on_output", "config": {"answer": {"expected": colour}}},
        "metadata": {"sha256": hashlib.sha256(image).hexdigest(), "colour": colour},
    }


@pytest.fixture(scope="module")
def batch(shared_stack: RunningStack) -> dict[str, Any]:
    tasks = [task(i) for i in range(TASKS)]
    batch_id = shared_stack.client.submit({"name": "images", "tasks": tasks})["batch_id"]
    shared_stack.wait(batch_id, timeout_s=600)
    sessions = {s["task_id"]: s for s in shared_stack.client.sessions(batch_id)}
    return {"batch_id": batch_id, "sessions": sessions, "tasks": {t["task_id"]: t for t in tasks}}


def test_every_image_task_completes_scored_by_the_colour_it_named(batch: dict[str, Any]) -> None:
    sessions = batch["sessions"]
    assert len(sessions) == TASKS
    assert {(s["state"], s["reward"]) for s in sessions.values()} == {("completed", 1.0)}


def test_each_image_is_stored_once_and_its_span_is_its_image_tokens(
    batch: dict[str, Any], shared_stack: RunningStack
) -> None:
    for task_id, session in batch["sessions"].items():
        sha = batch["tasks"][task_id]["metadata"]["sha256"]
        (call,) = shared_stack.client.calls(session["session_id"])
        (image,) = call["media"]
        assert (image["sha256"], image["source"], image["message_index"]) == (sha, "user", 0)
        assert image["image_token_id"] == IMAGE_TOKEN_ID and image["length"] == IMAGE_TOKENS
        span = call["prompt_token_ids"][image["offset"] : image["offset"] + image["length"]]
        assert span == [IMAGE_TOKEN_ID] * IMAGE_TOKENS
        # The stored request holds a reference, not the image's base64.
        url = call["request"]["messages"][0]["content"][0]["image_url"]["url"]
        assert url == f"data:image/png;polar-media,{sha}"
        (trajectory,) = shared_stack.client.trajectories(session["session_id"])
        assert trajectory["media"] == [{"sha256": sha, "call_id": call["call_id"], "offset": image["offset"],
                                        "length": IMAGE_TOKENS, "media_type": "image/png"}]  # fmt: skip
    shas = [t["metadata"]["sha256"] for t in batch["tasks"].values()]
    stored = shared_stack.sql("SELECT sha256, count(*) FROM media_objects WHERE sha256 = ANY(:s) GROUP BY sha256",
                              s=shas)  # fmt: skip
    assert sorted(stored) == sorted((sha, 1) for sha in shas)


def test_the_rl_export_carries_the_spans_and_the_read_token_fetches_the_bytes(
    batch: dict[str, Any], shared_stack: RunningStack, tmp_path: Path
) -> None:
    out = tmp_path / "rl.jsonl"
    counts = shared_stack.client.download(batch["batch_id"], "rl", "jsonl", None, out)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert counts["rows"] == len(rows) == TASKS
    reader = PolarClient(shared_stack.api_url, READ_TOKEN)
    for row in rows[:3]:
        (span,) = row["media"]
        assert row["token_ids"][span["offset"] : span["offset"] + span["length"]] == [IMAGE_TOKEN_ID] * IMAGE_TOKENS
        data, media_type = reader.media(span["sha256"])
        assert hashlib.sha256(data).hexdigest() == span["sha256"] and media_type == "image/png"
    sft = tmp_path / "sft.jsonl"
    shared_stack.client.download(batch["batch_id"], "sft", "jsonl", None, sft)
    conversation = json.loads(sft.read_text().splitlines()[0])
    (image,) = conversation["images"]  # in order, one per <image> in the messages' text
    assert conversation["messages"][0]["content"].startswith("<image>What colour")
    assert hashlib.sha256(base64.b64decode(image["data"])).hexdigest() == image["sha256"]
    sha = rows[0]["media"][0]["sha256"]
    assert httpx.get(f"{shared_stack.api_url}/v1/media/{sha}", timeout=30).status_code == 401
    with pytest.raises(APIError) as refused:
        PolarClient(shared_stack.api_url, "not-a-token-" + "x" * 30).media(sha)
    assert refused.value.status == 401


def test_a_task_image_that_is_no_image_is_refused_at_submission(shared_stack: RunningStack) -> None:
    bad = {**task(0), "images": ["data:image/png;base64," + base64.b64encode(b"not a png").decode()]}
    with pytest.raises(APIError) as refused:
        shared_stack.client.submit({"name": "bad-image", "tasks": [bad]})
    assert refused.value.status == 400 and "tasks[0].images[0]" in str(refused.value)


@pytest.mark.skipif(chromium_path() is None, reason="no Chromium here")
def test_the_console_shows_a_calls_image(batch: dict[str, Any], shared_stack: RunningStack, tmp_path: Path) -> None:
    session = batch["sessions"]["colour-02"]  # blue
    (call,) = shared_stack.client.calls(session["session_id"])
    with Browser.launch(tmp_path / "chromium") as browser:
        page = browser.new_page()
        page.goto(f"{shared_stack.api_url}/ui/login")
        page.evaluate(f"document.querySelector('#token').value = {json.dumps(READ_TOKEN)}")
        page.click_and_wait("#sign-in")
        page.goto(f"{shared_stack.api_url}/ui/calls/{call['call_id']}")
        page.evaluate("Promise.all([...document.images].map(i => i.decode()))")
        shown = page.evaluate("[...document.querySelectorAll('.image img')].map(i => [i.naturalWidth, i.src])")
        caption = page.evaluate("document.querySelector('.image figcaption').textContent")
        page.screenshot(tmp_path / "call-with-image.png")
        assert page.errors == []
        page.goto(f"{shared_stack.api_url}/ui/sessions/{session['session_id']}")  # where its time went
        rows = page.evaluate("[...document.querySelectorAll('#time-record th')].map(h => h.textContent.trim())")
        page.screenshot(tmp_path / "session-time.png")
        assert page.errors == []
    assert rows[:5] == ["queued", "init", "ready", "engine gate", "harness"] and rows[-1] == "total"
    sha = call["media"][0]["sha256"]
    assert shown == [[30, f"{shared_stack.api_url}/ui/media/{sha}"]]  # task 2's image: 30x28, decoded
    assert "message 0 (user)" in caption and "30\u00d728" in caption and f"({IMAGE_TOKENS})" in caption
