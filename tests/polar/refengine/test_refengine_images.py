"""The reference engine reads images as vLLM serves a VLM: ``image_url`` parts render ``<image>`` in place, each is
4 ids of 8192 in the prompt ids and in ``/tokenize``'s (vLLM 0.32's is expanded too), prompts stay prefixes of the
next turn's, bad images are 400s, and the ``image_colour`` policy names an image's colour."""

from __future__ import annotations

import base64
import io
import random
from collections.abc import Callable
from typing import Any

import pytest
from PIL import Image

from polar.chat.chat_template import ChatTemplate
from polar.chat.conversation import normalise_messages
from polar.chat.errors import EngineRequestError, MessageFormatError
from polar.chat.images import (
    IMAGE_TOKEN,
    IMAGE_TOKEN_ID,
    IMAGE_TOKENS,
    ImagePart,
    expand_image_ids,
    load_image,
    split_placeholders,
    with_placeholders,
)
from polar.chat.tokenizer import VOCAB_SIZE, Tokenizer
from polar.refengine.policies import PolicyRequest, SeenImage, load_policy
from polar.refengine.policies.image_colour import NO_IMAGE, NO_PIXELS, PALETTE, colour_name
from tests.polar.conftest import RunningEngine

StartEngine = Callable[..., RunningEngine]
RED, BLUE, GREEN = (220, 20, 30), (10, 30, 230), (20, 200, 40)
QUESTION = "What colour is the image?"
READ_TOOL = {"type": "function", "function": {"name": "Read", "parameters": {
    "type": "object", "properties": {"file_path": {"type": "string"}}, "required": ["file_path"]}}}  # fmt: skip


def data_url(colour: tuple[int, int, int], size: int = 28, kind: str = "PNG") -> str:
    buffer = io.BytesIO()
    Image.new("RGB", (size, size), colour).save(buffer, format=kind)
    media = "png" if kind == "PNG" else "jpeg"
    return f"data:image/{media};base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def image(colour: tuple[int, int, int], **fields: Any) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": data_url(colour, **fields)}}


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


def ask(colour: tuple[int, int, int], question: str = QUESTION) -> dict[str, Any]:
    return {"role": "user", "content": [text(question), image(colour)]}


def chat(engine: RunningEngine, messages: list[dict[str, Any]], status: int = 200, **body: Any) -> dict[str, Any]:
    response = engine.client.post("/v1/chat/completions", json={"messages": messages, "return_token_ids": True,
                                                                 "seed": 3, **body})  # fmt: skip
    assert response.status_code == status, response.text
    return response.json()


def said(reply: dict[str, Any]) -> str:
    """The answer's content stripped, as an exact-answer evaluator compares it (vLLM keeps the newlines after the
    reasoning)."""
    return str(reply["choices"][0]["message"]["content"]).strip()


def answer_of(reply: dict[str, Any]) -> dict[str, Any]:
    message = reply["choices"][0]["message"]
    return {"role": "assistant", "content": message["content"], "reasoning": message["reasoning"]}


def spliced(tok: Tokenizer, prompt: str) -> list[int]:
    """``prompt``'s ids with each ``<image>`` the image id: the text between encoded on its own."""
    pieces = prompt.split(IMAGE_TOKEN)
    ids = tok.encode(pieces[0])
    for piece in pieces[1:]:
        ids += [IMAGE_TOKEN_ID, *tok.encode(piece)]
    return ids


def test_the_image_id_follows_the_vocabulary_which_is_unchanged(tok: Tokenizer) -> None:
    assert IMAGE_TOKEN_ID == VOCAB_SIZE == tok.vocab_size and IMAGE_TOKENS == 4
    assert IMAGE_TOKEN_ID not in tok.encode(f"look {IMAGE_TOKEN} here")  # text stays text
    assert tok.decode([IMAGE_TOKEN_ID, *tok.encode(" x")], images=True) == "<image> x"
    assert tok.id_to_token(IMAGE_TOKEN_ID) == IMAGE_TOKEN
    with pytest.raises(EngineRequestError, match="out of vocabulary"):
        tok.decode([IMAGE_TOKEN_ID])  # only where a caller allows images
    with pytest.raises(EngineRequestError, match="out of vocabulary"):
        tok.decode([IMAGE_TOKEN_ID + 1], images=True)


def test_messages_keep_text_and_place_images() -> None:
    (message,) = normalise_messages([{"role": "user", "content": [text("a"), image(RED), text("bc"), image(BLUE)]}])
    assert message.content == "abc" and [part.offset for part in message.images] == [1, 3]
    assert with_placeholders(message.content, message.images) == "a<image>bc<image>"
    rendered = ChatTemplate().render([message], add_generation_prompt=False)
    assert rendered == "<|im_start|>user\na<image>bc<image><|im_end|>\n"
    assert split_placeholders("a" + IMAGE_TOKEN * 4 + "bc" + IMAGE_TOKEN) == (
        "abc",
        (ImagePart(None, 1), ImagePart(None, 3)),
    )


@pytest.mark.parametrize(
    "content",
    [
        [{"type": "image_url"}],
        [{"type": "image_url", "image_url": {"url": "x"}}],
        [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA", "detail": "original"}}],
        [{"type": "image", "image": "data:image/png;base64,AAAA"}],
    ],
)
def test_malformed_image_parts_are_refused(content: list[Any]) -> None:
    with pytest.raises(MessageFormatError):
        normalise_messages([{"role": "user", "content": content}])


def test_assistant_messages_hold_no_images() -> None:
    with pytest.raises(MessageFormatError, match="assistant"):
        normalise_messages([{"role": "assistant", "content": [image(RED)]}])


def test_each_image_is_four_image_ids_in_place(start_engine: StartEngine, tok: Tokenizer) -> None:
    engine = start_engine(policy="image_colour")
    messages = [{"role": "user", "content": [text("first "), image(RED), text(" then "), image(BLUE), text("?")]}]
    reply = chat(engine, messages)
    prompt = ChatTemplate().render(normalise_messages(messages))
    assert prompt.count(IMAGE_TOKEN) == 2 and "first <image> then <image>?" in prompt
    ids = reply["prompt_token_ids"]
    assert ids == expand_image_ids(spliced(tok, prompt))
    assert ids.count(IMAGE_TOKEN_ID) == 2 * IMAGE_TOKENS and reply["usage"]["prompt_tokens"] == len(ids)
    first = ids.index(IMAGE_TOKEN_ID)
    assert ids[first : first + IMAGE_TOKENS] == [IMAGE_TOKEN_ID] * IMAGE_TOKENS
    assert ids[:first] == tok.encode(prompt.split(IMAGE_TOKEN)[0])  # the text before it is as a text prompt's


def test_tokenize_answers_the_expanded_ids(start_engine: StartEngine, tok: Tokenizer) -> None:
    engine = start_engine(policy="image_colour")
    messages = [ask(RED)]
    response = engine.client.post("/tokenize", json={"messages": messages, "return_token_strs": True})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["tokens"].count(IMAGE_TOKEN_ID) == IMAGE_TOKENS and body["count"] == len(body["tokens"])
    assert body["token_strs"][body["tokens"].index(IMAGE_TOKEN_ID)] == IMAGE_TOKEN
    assert body["tokens"] == chat(engine, messages)["prompt_token_ids"]
    # How the proxy learns the image token: the same message with and without an image differs by one id.
    plain, with_image = (
        engine.client.post("/tokenize", json={"messages": [{"role": "user", "content": content}]})
        for content in ([text("Look.")], [image(GREEN), text("Look.")])
    )
    assert set(with_image.json()["tokens"]) - set(plain.json()["tokens"]) == {IMAGE_TOKEN_ID}
    detokenized = engine.client.post("/detokenize", json={"tokens": with_image.json()["tokens"]})
    expected = f"<|im_start|>user\n{IMAGE_TOKEN * IMAGE_TOKENS}Look.<|im_end|>\n<|im_start|>assistant\n"
    assert detokenized.json()["prompt"] == expected


def test_a_resent_conversation_extends_the_last_prompt_and_completion(start_engine: StartEngine) -> None:
    engine = start_engine(policy="image_colour")
    first = chat(engine, [ask(RED)])
    turn_one = first["prompt_token_ids"] + first["choices"][0]["token_ids"]
    messages = [ask(RED), answer_of(first), ask(BLUE, "And this one?")]
    second = chat(engine, messages)
    assert second["prompt_token_ids"][: len(turn_one)] == turn_one
    assert second["prompt_token_ids"].count(IMAGE_TOKEN_ID) == 2 * IMAGE_TOKENS
    assert (said(first), said(second)) == ("red", "blue")


def test_text_only_prompts_are_unchanged(start_engine: StartEngine, tok: Tokenizer) -> None:
    engine = start_engine(policy="echo")
    messages = [{"role": "user", "content": [text("write <image> as text")]}]
    reply = chat(engine, messages)
    assert reply["prompt_token_ids"] == tok.encode(ChatTemplate().render(normalise_messages(messages)))
    assert IMAGE_TOKEN_ID not in reply["prompt_token_ids"]


@pytest.mark.parametrize(
    ("colour", "name"), [(RED, "red"), (BLUE, "blue"), (GREEN, "green"), ((250, 250, 245), "white")]
)
def test_the_colour_policy_names_the_image_colour(
    start_engine: StartEngine, colour: tuple[int, int, int], name: str
) -> None:
    engine = start_engine(policy="image_colour")
    reply = chat(engine, [ask(colour)])
    assert said(reply) == name
    assert reply["choices"][0]["finish_reason"] == "stop"


def test_the_colour_policy_reads_jpeg_and_other_sizes() -> None:
    policy = load_policy("image_colour", {"answer": "The image is {colour}.", "think": False})
    (message,) = normalise_messages([{"role": "user", "content": [text(QUESTION), image(RED, size=300, kind="JPEG")]}])
    seen = SeenImage(0, load_image(message.images[0]))
    turn = policy.respond(PolicyRequest(messages=(message,), images=(seen,)))
    assert turn.content == "The image is red." and turn.reasoning is None
    assert seen.image is not None and (seen.image.width, seen.image.height) == (300, 300)


def test_the_colour_policy_reads_an_image_file_through_the_read_tool(start_engine: StartEngine) -> None:
    engine = start_engine(policy="image_colour")
    task = {"role": "user", "content": "What colour is the image in pixel.png? The working directory is /work."}
    call = chat(engine, [task], tools=[READ_TOOL])
    (tool_call,) = call["choices"][0]["message"]["tool_calls"]
    assert tool_call["function"]["name"] == "Read"
    # The tool result's image comes in the user message after the tool message (the contract of issue 58).
    assistant = {"role": "assistant", "content": None, "tool_calls": [tool_call]}
    result = {"role": "tool", "tool_call_id": tool_call["id"], "content": "Read image (28x28)"}
    shown = {"role": "user", "content": [image(BLUE)]}
    reply = chat(engine, [task, assistant, result, shown], tools=[READ_TOOL])
    assert said(reply) == "blue"
    assert said(chat(engine, [task])) == NO_IMAGE


def test_the_colour_policy_without_pixels_says_so(start_engine: StartEngine, tok: Tokenizer) -> None:
    engine = start_engine(policy="image_colour")
    first = chat(engine, [ask(RED)])
    # The same prompt as token ids (TITO): accepted, its image a placeholder with no pixels.
    response = engine.client.post("/v1/completions", json={"prompt": first["prompt_token_ids"], "max_tokens": 64,
                                                            "return_token_ids": True})  # fmt: skip
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    assert choice["prompt_token_ids"] == first["prompt_token_ids"]
    assert NO_PIXELS in choice["text"]


def test_colour_names_are_the_nearest_in_the_palette() -> None:
    assert all(colour_name(rgb) == name for name, rgb in PALETTE.items())
    assert colour_name((200, 60, 50)) == "red" and colour_name((30, 30, 40)) == "black"
    policy = load_policy("image_colour", {"accuracy": 0.0})
    (message,) = normalise_messages([ask(RED)])
    turn = policy.respond(PolicyRequest(messages=(message,), images=(SeenImage(0, load_image(message.images[0])),),
                                        rng=random.Random(1)))  # fmt: skip
    assert turn.content in PALETTE and turn.content != "red"


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("data:image/png;base64,not base64!", "base64"),
        ("data:image/png;base64," + base64.b64encode(b"these bytes are no image").decode(), "cannot be decoded"),
        ("data:image/png," + "abc", "base64 data URLs"),
        ("https://example.com/cat.png", "fetches no image URLs"),
    ],
)
def test_a_bad_image_is_a_400_in_vllms_shape(start_engine: StartEngine, url: str, says: str) -> None:
    engine = start_engine(policy="image_colour")
    messages = [{"role": "user", "content": [text(QUESTION), {"type": "image_url", "image_url": {"url": url}}]}]
    for path in ("/v1/chat/completions", "/tokenize"):
        response = engine.client.post(path, json={"messages": messages})
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["type"] == "BadRequestError" and error["code"] == 400 and says in error["message"]
        assert error["message"].startswith("messages[0]")


def test_a_text_writing_the_placeholder_beside_an_image_is_a_400(start_engine: StartEngine) -> None:
    engine = start_engine(policy="image_colour")
    reply = chat(engine, [{"role": "user", "content": [text(f"see {IMAGE_TOKEN}"), image(RED)]}], status=400)
    assert "placeholders for 1 images" in reply["error"]["message"]


def test_a_truncated_image_is_a_400(start_engine: StartEngine) -> None:
    engine = start_engine(policy="image_colour")
    whole = base64.b64decode(data_url(RED, size=64).split(",", 1)[1])
    url = "data:image/png;base64," + base64.b64encode(whole[: len(whole) // 2]).decode()
    reply = chat(engine, [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}], status=400)
    assert reply["error"]["type"] == "BadRequestError"
