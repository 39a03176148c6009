"""The real CLIs looking at a picture through the whole pipeline (the shared stack's ``image_colour`` route): a task's
image (a flat red PNG in ``images``, copied into the work directory as ``image-1.png``).

Claude Code is asked about the file: the policy calls its ``Read`` tool on it, the CLI answers with an Anthropic
``tool_result`` holding an ``image`` block, and the next call captures that image from inside the tool result
(``source`` ``tool_result``, its span 4 image tokens in the prompt; the stored request a ``polar-media:`` reference).
Codex is given the file on its command line (``codex exec -i image-1.png``): its first call carries it as a user
image. Both sessions are scored by the colour named. One batch.
"""

from __future__ import annotations

import base64
import hashlib
import io
from collections.abc import Iterator
from typing import Any

import pytest

from polar.chat.images import IMAGE_TOKEN_ID, IMAGE_TOKENS
from polar.harnesses.install import install
from polar.storage.media import BARE_PREFIX
from tests.e2e.file_task import wait_finished
from tests.shared_stack import routed
from tests.stacks import RunningStack

pytestmark = pytest.mark.timeout(900)  # installs two CLIs, then one wave (about 10 s)

QUESTIONS = {
    "claude_code": "What colour is the picture in image-1.png? Read the file, then answer with one word.",
    "codex": "What colour is the picture? Answer with one word.",
}
SETTINGS: dict[str, dict[str, Any]] = {"claude_code": {}, "codex": {"extra_args": ["-i", "image-1.png"]}}


def red_png() -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (64, 64), (255, 0, 0)).save(buffer, format="PNG")
    return buffer.getvalue()


PNG = red_png()
SHA = hashlib.sha256(PNG).hexdigest()


@pytest.fixture(scope="module")
def sessions(shared_stack: RunningStack) -> dict[str, dict[str, Any]]:
    install(list(QUESTIONS))
    tasks = [
        {
            "task_id": f"image-{cli}",
            "instruction": routed("image_colour", question),
            "timeout_seconds": 300,
            "reconstruction": "prefix_merging",
            "images": [f"data:image/png;base64,{base64.b64encode(PNG).decode()}"],
            "harness": {"name": cli, **({"settings": SETTINGS[cli]} if SETTINGS[cli] else {})},
            "evaluator": {"name": "test_on_output", "config": {"answer": {"expected": "red"}}},
        }
        for cli, question in QUESTIONS.items()
    ]
    submitted = shared_stack.client.submit({"name": "harness-images", "tasks": tasks})
    wait_finished(shared_stack, submitted["batch_id"], timeout_s=600)
    found = {}
    for session in shared_stack.client.sessions(submitted["batch_id"]):
        calls = sorted(shared_stack.client.calls(session["session_id"]), key=lambda c: c["seq"])
        found[session["task_id"].removeprefix("image-")] = {**session, "calls": calls}
    for cli, session in sorted(found.items()):
        media = [[(m["source"], m["message_index"], m["sha256"][:8]) for m in c["media"] or ()]
                 for c in session["calls"]]  # fmt: skip
        print(f"{cli:12} {session['state']:10} reward={session['reward']} {len(session['calls'])} calls  {media}")
    return found


def _blocks(value: Any) -> Iterator[dict[str, Any]]:
    """Every JSON object in ``value``, depth first."""
    if isinstance(value, dict):
        yield value
        for item in value.values():
            yield from _blocks(item)
    elif isinstance(value, list):
        for item in value:
            yield from _blocks(item)


def _tool_result_images(request: dict[str, Any]) -> list[dict[str, Any]]:
    """The image blocks inside the Anthropic request's ``tool_result`` blocks."""
    results = [b for b in _blocks(request.get("messages")) if b.get("type") == "tool_result"]
    return [b for r in results for b in _blocks(r.get("content")) if b.get("type") == "image"]


def _check_span(call: dict[str, Any], image: dict[str, Any]) -> None:
    assert image["image_token_id"] == IMAGE_TOKEN_ID and image["length"] == IMAGE_TOKENS
    span = call["prompt_token_ids"][image["offset"] : image["offset"] + image["length"]]
    assert span == [IMAGE_TOKEN_ID] * IMAGE_TOKENS


def _diagnosis(session: dict[str, Any]) -> str:
    return f"error={session.get('error')!r} evaluation={session.get('evaluation')!r}"


def test_claude_code_reads_the_png_and_the_tool_result_image_is_captured(
    sessions: dict[str, dict[str, Any]],
) -> None:
    session = sessions["claude_code"]
    assert (session["state"], session["reward"]) == ("completed", 1.0), _diagnosis(session)
    calls = session["calls"]
    assert not calls[0]["media"]  # the question, before the Read (the API gives null for a call without images)
    (call,) = [c for c in calls if _tool_result_images(c["request"])]
    (block,) = _tool_result_images(call["request"])
    assert block["source"]["data"] == f"{BARE_PREFIX}{SHA}", block
    (image,) = call["media"]
    assert (image["source"], image["sha256"], image["media_type"]) == ("tool_result", SHA, "image/png")
    _check_span(call, image)


def test_codex_sends_the_command_line_image_with_its_first_call(sessions: dict[str, dict[str, Any]]) -> None:
    session = sessions["codex"]
    assert (session["state"], session["reward"]) == ("completed", 1.0), _diagnosis(session)
    first = session["calls"][0]
    (image,) = [m for m in first["media"] or () if m["source"] == "user"]
    assert image["sha256"] == SHA
    _check_span(first, image)
