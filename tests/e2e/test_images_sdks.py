"""Images through Polar to real vLLM serving the tiny VLM (``polar engine --backend vllm --model tiny-vlm``), from
each official SDK: the ``openai`` SDK's Chat Completions and Responses, ``anthropic`` and ``google-genai``, each a
two-turn conversation with an image in each turn (the first resent in the second).

For every protocol: the answers arrive in the SDK's own types; every captured prompt is the ids vLLM's own
``/tokenize`` gives for what the engine was sent (its stored form, the images' bytes put back); each image's span
is a run of 4 image ids where it stands; the two calls merge into one trajectory whose spans are the two images,
each with the call that brought it in; and each image's bytes are stored once, the payloads holding references.
Also: the tiny VLM itself turns any image into 4 image ids, and its ``/tokenize`` is expanded like its answers.

One server for the module, held to the ``scripted`` policy's turns (the forcing logits processor): reasoning, then
the answer. Each SDK shows the reasoning and sends it back in its own way (Chat's ``reasoning``, a Responses
reasoning item, an Anthropic thinking block, Gemini thought parts), so what the model said re-renders as the ids it
sampled; a client that drops it breaks the chain (``reasoning_dropped``), images or not.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import json
import os
import signal
import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from polar.chat.images import IMAGE_TOKEN_ID, IMAGE_TOKENS
from polar.local.launcher import Stack, free_port, gunicorn_spec
from polar.reconstruction.prefix_merging import reconstruct
from polar.refengine.vllm import vllm_python
from polar.stages.postrun import captured_calls
from polar.storage import media
from tests.live_proxy import LiveProxy
from tests.processes import HANG_GUARD_S
from tests.real_vllm import POLAR, wait_ready
from tests.stacks import _live
from tests.stage_calls import domain_services

pytestmark = [
    pytest.mark.long(seconds=90),  # dealt out first (tests/conftest.py)
    pytest.mark.skipif(vllm_python() is None, reason="vLLM is not installed (polar engine --backend vllm --install)"),
]

ANSWER = "It is a red square."
REASONING = "I look at the picture."
TURNS = [{"reasoning": REASONING, "content": ANSWER}]  # every turn (the last one repeats)
MODEL = "tiny-vlm"


def picture(colour: tuple[int, int, int], size: tuple[int, int] = (28, 28), image_format: str = "PNG") -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", size, colour).save(buffer, format=image_format)
    return buffer.getvalue()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def data_url(data: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64,{b64(data)}"


def image_runs(ids: list[int]) -> list[int]:
    """The lengths of the runs of image ids in ``ids``."""
    runs, length = [], 0
    for token in [*ids, None]:
        if token == IMAGE_TOKEN_ID:
            length += 1
        elif length:
            runs, length = [*runs, length], 0
    return runs


@pytest.fixture(scope="module")
def vlm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The tiny VLM's server URL (built into the engine cache first, once per cache)."""
    port, log = free_port(), tmp_path_factory.mktemp("tiny-vlm") / "vllm.log"
    command = [POLAR, "engine", "--backend", "vllm", "--model", "tiny-vlm", "--port", str(port),
               "--policy", "scripted", "--policy-config", json.dumps({"turns": TURNS})]  # fmt: skip
    with log.open("ab") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   start_new_session=True)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, lambda: process.poll() is None, log, "the tiny VLM's server")
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@pytest.fixture(scope="module")
def proxy(vlm: str, module_database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveProxy]:
    """Polar's proxy under gunicorn in front of the tiny VLM."""
    tmp = tmp_path_factory.mktemp("images-proxy")
    port = free_port()
    env = {"POLAR_DATABASE_URL": module_database_url, "POLAR_ENGINE_URLS": vlm}
    with _live(Stack([gunicorn_spec("proxy", "web.proxy:create_app()", port)], env, tmp / "logs")):
        services = domain_services(module_database_url, tmp)
        try:
            yield LiveProxy(f"http://127.0.0.1:{port}", services, vlm, tmp / "none.jsonl")
        finally:
            services.db.dispose()


def _chat(url: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """A chat call straight to vLLM with Polar's capture fields (polar.fleet.backends.base.capture_fields)."""
    from openai import OpenAI

    client = OpenAI(base_url=f"{url}/v1", api_key="none", timeout=HANG_GUARD_S, max_retries=0)
    answer = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=64, logprobs=True, top_logprobs=0,  # type: ignore[arg-type]
        extra_body={"return_token_ids": True},
    )  # fmt: skip
    return answer.model_dump()


def test_the_tiny_vlm_turns_any_image_into_4_image_ids_and_tokenizes_expanded(vlm: str) -> None:
    parts = [{"type": "image_url", "image_url": {"url": data_url(picture((9, 9, 9), (64, 48), "JPEG"), "image/jpeg")}},
             {"type": "text", "text": " and "},
             {"type": "image_url", "image_url": {"url": data_url(picture((200, 30, 30), (30, 90)))}}]  # fmt: skip
    messages = [{"role": "user", "content": parts}]
    answer = _chat(vlm, messages)
    assert image_runs(answer["prompt_token_ids"]) == [IMAGE_TOKENS, IMAGE_TOKENS] == [4, 4]
    assert answer["choices"][0]["message"]["content"].strip() == ANSWER  # forced: the policy's answer
    tokenized = httpx.post(f"{vlm}/tokenize", json={"model": MODEL, "messages": messages}, timeout=HANG_GUARD_S)
    assert tokenized.json()["tokens"] == answer["prompt_token_ids"]  # vLLM 0.32's /tokenize is expanded too


def _check(proxy: LiveProxy, session_id: uuid.UUID, provider: str, first: bytes, second: bytes) -> None:
    calls = proxy.calls(session_id)
    assert [(c["provider"], c["status_code"]) for c in calls] == [(provider, 200)] * 2
    shas = [hashlib.sha256(image).hexdigest() for image in (first, second)]
    with proxy.services.db.engine.connect() as connection:
        data_of = {sha: image.data for sha, image in media.load(connection, shas).items()}
        assert sorted(data_of) == sorted(shas)  # each stored once: the table's key is its sha256
        stored = connection.execute(
            sa.text("SELECT request::text || normalized_request::text FROM model_calls WHERE session_id = :s"),
            {"s": session_id},
        ).scalars()
        for text in stored:  # the payloads hold references, never an image's base64 (in any of its spellings)
            for image in (first, second):
                for spelling in (b64(image), base64.urlsafe_b64encode(image).decode().rstrip("=")):
                    assert spelling[:64] not in text
    for call, expected in zip(calls, ([shas[0]], shas), strict=True):
        prompt = call["prompt_token_ids"]
        assert [m["sha256"] for m in call["media"]] == expected
        for entry in call["media"]:
            assert entry["length"] == IMAGE_TOKENS and entry["image_token_id"] == IMAGE_TOKEN_ID
            assert prompt[entry["offset"] : entry["offset"] + entry["length"]] == [IMAGE_TOKEN_ID] * IMAGE_TOKENS
        assert image_runs(prompt) == [IMAGE_TOKENS] * len(expected)
        # What vLLM reads the stored request as, its images put back, is the captured prompt id for id.
        assert proxy.prompt_ids(media.restored(call["normalized_request"], data_of)) == prompt
    assert calls[1]["media"][0]["offset"] == calls[0]["media"][0]["offset"]
    merged = calls[0]["prompt_token_ids"] + calls[0]["completion_token_ids"]
    if calls[1]["prompt_token_ids"][: len(merged)] != merged:  # say where, before the trajectory count fails
        from polar.chat.tokenizer import load_tokenizer
        from polar.reconstruction.prefix_merging import common_prefix

        at = common_prefix(merged, calls[1]["prompt_token_ids"])
        decode = load_tokenizer().decode
        pytest.fail(f"call 2 does not extend call 1 at {at}: {decode(merged[at - 5 : at + 10])!r} then "
                    f"{decode(calls[1]['prompt_token_ids'][at - 5 : at + 10])!r}")  # fmt: skip
    (trajectory,) = reconstruct(captured_calls(proxy.services, session_id))
    assert [(m["sha256"], m["call_id"]) for m in trajectory.media] == [
        (shas[0], calls[0]["call_id"]), (shas[1], calls[1]["call_id"])
    ]  # fmt: skip
    assert trajectory.call_ids == [calls[0]["call_id"], calls[1]["call_id"]]


RED, BLUE = picture((220, 20, 20)), picture((20, 20, 220), (40, 30))


def test_openai_chat_completions(proxy: LiveProxy) -> None:
    import openai

    session_id, key = proxy.session()
    client = openai.OpenAI(base_url=f"{proxy.base(key)}/v1", api_key=key, max_retries=0)
    messages: list[Any] = [{"role": "user", "content": [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": data_url(RED), "detail": "original"}},  # Codex's: dropped
    ]}]  # fmt: skip
    first = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=64)
    assert isinstance(first, openai.types.chat.ChatCompletion)
    assert (first.choices[0].message.content or "").strip() == ANSWER
    echoed: dict[str, Any] = {"role": "assistant", "content": first.choices[0].message.content}
    reasoning = (first.choices[0].message.model_extra or {}).get("reasoning")
    if reasoning is not None:
        echoed["reasoning"] = reasoning
    messages += [echoed, {"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(BLUE)}},
                                                      {"type": "text", "text": "And this?"}]}]  # fmt: skip
    second = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=64)
    assert (second.choices[0].message.content or "").strip() == ANSWER
    _check(proxy, session_id, "openai_chat", RED, BLUE)


def test_openai_responses(proxy: LiveProxy) -> None:
    import openai

    session_id, key = proxy.session()
    client = openai.OpenAI(base_url=f"{proxy.base(key)}/v1", api_key=key, max_retries=0)
    history: list[Any] = [{"role": "user", "content": [
        {"type": "input_text", "text": "What is this?"},
        {"type": "input_image", "image_url": data_url(RED), "detail": "auto"},
    ]}]  # fmt: skip
    shown: Any = {"reasoning": {"effort": "medium", "summary": "auto"}, "include": ["reasoning.encrypted_content"]}
    first = client.responses.create(model=MODEL, input=history, max_output_tokens=64, store=False, **shown)
    assert isinstance(first, openai.types.responses.Response) and first.output_text.strip() == ANSWER
    history += [item.model_dump(exclude_none=True) for item in first.output]
    history.append({"role": "user", "content": [{"type": "input_image", "image_url": data_url(BLUE), "detail": "low"},
                                                {"type": "input_text", "text": "And this?"}]})  # fmt: skip
    second = client.responses.create(model=MODEL, input=history, max_output_tokens=64, store=False, **shown)
    assert second.output_text.strip() == ANSWER
    _check(proxy, session_id, "openai_responses", RED, BLUE)


def test_anthropic_messages(proxy: LiveProxy) -> None:
    import anthropic

    session_id, key = proxy.session()
    client = anthropic.Anthropic(base_url=proxy.base(key), api_key=key, max_retries=0)

    def image(data: bytes) -> dict[str, Any]:
        return {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(data)}}

    messages: list[Any] = [{"role": "user", "content": [image(RED), {"type": "text", "text": "What is this?"}]}]
    thinking: Any = {"type": "enabled", "budget_tokens": 1024}
    first = client.messages.create(model=MODEL, max_tokens=2048, messages=messages, thinking=thinking)
    assert [block.type for block in first.content] == ["thinking", "text"]
    assert isinstance(first, anthropic.types.Message) and first.content[-1].type == "text"
    assert first.content[-1].text.strip() == ANSWER  # type: ignore[union-attr]
    messages += [{"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in first.content]},
                 {"role": "user", "content": [{"type": "text", "text": "And this?"}, image(BLUE)]}]  # fmt: skip
    second = client.messages.create(model=MODEL, max_tokens=2048, messages=messages, thinking=thinking)
    assert second.content[-1].text.strip() == ANSWER  # type: ignore[union-attr]
    _check(proxy, session_id, "anthropic", RED, BLUE)


def test_gemini_generate_content(proxy: LiveProxy) -> None:
    from google import genai
    from google.genai import types

    session_id, key = proxy.session()
    client = genai.Client(api_key=key, http_options=types.HttpOptions(base_url=proxy.base(key), api_version="v1beta"))
    config = types.GenerateContentConfig(
        max_output_tokens=64, thinking_config=types.ThinkingConfig(include_thoughts=True)
    )
    contents: list[Any] = [types.Content(role="user", parts=[types.Part.from_bytes(data=RED, mime_type="image/png"),
                                                             types.Part(text="What is this?")])]  # fmt: skip
    first = client.models.generate_content(model=MODEL, contents=contents, config=config)
    assert isinstance(first, types.GenerateContentResponse) and (first.text or "").strip() == ANSWER
    assert first.candidates and first.candidates[0].content is not None
    blue = types.Part.from_bytes(data=BLUE, mime_type="image/png")
    contents += [first.candidates[0].content, types.Content(role="user", parts=[types.Part(text="And this?"), blue])]
    second = client.models.generate_content(model=MODEL, contents=contents, config=config)
    assert (second.text or "").strip() == ANSWER
    _check(proxy, session_id, "gemini", RED, BLUE)
