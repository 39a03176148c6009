"""Images in, in every protocol's normalisation (``polar.protocols.images``, issue 58): the chat ``image_url`` parts
each protocol produces, the ``ImageInput`` list in ``options["images"]`` (each pointing at the message holding its
part), tool-result images moved after the turn's tool messages, and the refusals, named by field. The last tests
send requests through the official SDKs (their own transports, no network) to read the field names and base64 they
really send."""

from __future__ import annotations

import base64
import hashlib
import io
import json
from typing import Any

import anthropic as anthropic_sdk
import httpx
import httpx2
import openai as openai_sdk
import pytest
from google import genai
from google.genai import types as genai_types
from PIL import Image

from polar.errors import ValidationError
from polar.protocols import ClientRequest, RequestContext, anthropic, gemini, images, openai_chat, openai_responses


def encoded(kind: str = "PNG", size: tuple[int, int] = (3, 2), colour: tuple[int, int, int] = (200, 10, 30)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, colour).save(buffer, kind)
    return buffer.getvalue()


PNG = encoded()
PNG_B64 = base64.b64encode(PNG).decode()
JPEG = encoded("JPEG", (4, 4))
JPEG_B64 = base64.b64encode(JPEG).decode()
GIF_B64 = base64.b64encode(encoded("GIF", (2, 5))).decode()
WEBP_B64 = base64.b64encode(encoded("WEBP", (6, 3))).decode()
PNG_URL = f"data:image/png;base64,{PNG_B64}"
JPEG_URL = f"data:image/jpeg;base64,{JPEG_B64}"
NOT_IMAGE_B64 = base64.b64encode(b"%PDF-1.7 not an image at all").decode()
BROKEN_PNG_B64 = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\x00" * 40).decode()  # the magic, then nothing readable
REMOTE = "https://example.com/cat.png"


def image_parts(request: ClientRequest) -> list[tuple[int, dict[str, Any]]]:
    """(message index, image_url part) of every image part in the normalised messages, in order."""
    found = []
    for index, message in enumerate(request.engine_body["messages"]):
        if isinstance(message.get("content"), list):
            found += [(index, part) for part in message["content"] if part.get("type") == "image_url"]
    return found


def checked(request: ClientRequest) -> tuple[images.ImageInput, ...]:
    """``options["images"]``, after checking that each entry names the message holding its part, in order."""
    listed = request.options["images"]
    assert isinstance(listed, tuple)
    expected = [(index, part["image_url"]["url"]) for index, part in image_parts(request)]
    assert [(image.message_index, image.url or images.data_url(image)) for image in listed] == expected
    return listed


def refused(call: Any, body: Any, field: str, words: str) -> None:
    with pytest.raises(ValidationError) as caught:
        call(body)
    assert caught.value.field == field, caught.value
    assert words in str(caught.value)


# --- the shared module ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "declared", "media_type", "size"),
    [
        (PNG_B64, "image/png", "image/png", (3, 2)),
        (JPEG_B64, "image/jpg", "image/jpeg", (4, 4)),  # the alias
        (JPEG_B64, "IMAGE/JPEG", "image/jpeg", (4, 4)),
        (GIF_B64, None, "image/gif", (2, 5)),  # no declared type: the bytes' own
        (WEBP_B64, "image/webp", "image/webp", (6, 3)),
    ],
)
def test_decoding_reads_type_and_size_from_the_bytes(
    text: str, declared: str | None, media_type: str, size: tuple[int, int]
) -> None:
    image = images.decode_image(text, declared, "f", 3, "user")
    assert (image.media_type, (image.width, image.height), image.message_index, image.source) == (
        media_type, size, 3, "user",
    )  # fmt: skip
    assert image.data == base64.b64decode(text) and image.sha256 == hashlib.sha256(image.data).hexdigest()
    assert image.url is None


@pytest.mark.parametrize(
    ("text", "declared", "words"),
    [
        ("", None, "required"),
        (PNG_B64[:-2], None, "not valid base64"),  # padding cut
        (PNG_B64[:8] + "*" + PNG_B64[9:], None, "not valid base64"),
        (PNG_B64[:8] + "\n" + PNG_B64[8:], None, "not valid base64"),  # strict: no line breaks
        ("ümlaut==", None, "not valid base64"),
        (PNG_B64, "image/jpeg", "declared as image/jpeg but the bytes are image/png"),
        (PNG_B64, "application/pdf", "declared as application/pdf"),
        (NOT_IMAGE_B64, None, "not a PNG, JPEG, GIF or WEBP image"),
        (BROKEN_PNG_B64, "image/png", "cannot be read"),
        (PNG_B64, 5, "media type must be a string"),
    ],
)
def test_decoding_refuses_what_is_no_image(text: str, declared: Any, words: str) -> None:
    with pytest.raises(ValidationError) as caught:
        images.decode_image(text, declared, "messages[1].content[0].image_url.url", 1, "user")
    assert caught.value.field == "messages[1].content[0].image_url.url" and words in str(caught.value)
    assert str(caught.value).startswith("messages[1].content[0].image_url.url: ")


def test_urlsafe_base64_is_taken_where_allowed() -> None:
    text = next(
        b64 for shade in range(256) if ("+" in (b64 := base64.b64encode(encoded(colour=(shade, 250, 7))).decode()))
    )
    safe = text.translate(str.maketrans("+/", "-_"))
    assert images.decode_image(safe.rstrip("="), None, "f", 0, "user", urlsafe=True).data == base64.b64decode(text)
    with pytest.raises(ValidationError, match="not valid base64"):
        images.decode_image(safe, None, "f", 0, "user")


def test_data_urls_parts_and_details() -> None:
    assert images.parse_data_url(PNG_URL, "f") == ("image/png", PNG_B64)
    assert images.parse_data_url("DATA:;charset=x;BASE64,AAAA", "f") == (None, "AAAA")
    for bad in ("data:image/png,AAAA", "data:image/png;base64", "image/png;base64,AAAA"):
        with pytest.raises(ValidationError):
            images.parse_data_url(bad, "f")
    assert images.image_part("u", "high") == {"type": "image_url", "image_url": {"url": "u", "detail": "high"}}
    for dropped in (None, "original", "HIGH", 3, ["low"]):
        assert images.image_part("u", dropped) == {"type": "image_url", "image_url": {"url": "u"}}
    part, image = images.from_url(f"data:image/jpg;base64,{JPEG_B64}", "f", "user", "auto")
    assert part == {"type": "image_url", "image_url": {"url": JPEG_URL, "detail": "auto"}}  # the bytes' own type
    part, image = images.from_url(REMOTE, "f", "tool_result")
    assert part == {"type": "image_url", "image_url": {"url": REMOTE}}
    assert image == images.ImageInput(None, "", None, None, None, images.UNPLACED, "tool_result", REMOTE)
    for wrong in ("ftp://example.com/x.png", "x", "", None, {"url": REMOTE}):
        with pytest.raises(ValidationError, match="data URL"):
            images.from_url(wrong, "f", "user")
    assert images.url_image("gs://b/x", "image/JPG", 0, "user").media_type == "image/jpeg"


def test_content_is_a_string_until_an_image_comes() -> None:
    assert images.content(["a", "b"]) == "a\nb" and images.content([]) == ""
    part = images.image_part(REMOTE)
    assert images.content(["a", "b", part, "c"]) == [{"type": "text", "text": "a\nb"}, part,
                                                     {"type": "text", "text": "c"}]  # fmt: skip
    assert images.content([part]) == [part]


# --- OpenAI chat ---------------------------------------------------------------------------------------------


def chat(*messages: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": list(messages), **extra}


def test_chat_image_parts_are_taken() -> None:
    body = chat(
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [
            {"type": "text", "text": "compare"},
            {"type": "image_url", "image_url": {"url": PNG_URL, "detail": "low"}},
            {"type": "image_url", "image_url": f"data:image/jpg;base64,{JPEG_B64}"},  # a bare string, the alias
        ]},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": REMOTE, "detail": "original"}}]},
    )  # fmt: skip
    request = openai_chat.normalize(body)
    assert request.engine_body["messages"][1]["content"] == [
        {"type": "text", "text": "compare"},
        {"type": "image_url", "image_url": {"url": PNG_URL, "detail": "low"}},
        {"type": "image_url", "image_url": {"url": JPEG_URL}},
    ]
    assert request.engine_body["messages"][3]["content"] == [{"type": "image_url", "image_url": {"url": REMOTE}}]
    first, second, third = checked(request)
    assert (first.media_type, first.width, first.height, first.message_index, first.source) == (
        "image/png", 3, 2, 1, "user",
    )  # fmt: skip
    assert (second.media_type, second.message_index, third.url, third.message_index) == ("image/jpeg", 1, REMOTE, 3)
    assert body["messages"][1]["content"][1]["image_url"]["detail"] == "low"  # the client's body stays as it was
    counted = openai_chat.count_tokens_request(body)
    assert counted["messages"] == request.engine_body["messages"]


def test_chat_without_images_normalises_as_before() -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": "hi"}]},
                                      {"role": "assistant", "content": "x"}]  # fmt: skip
    request = openai_chat.normalize(chat(*messages))
    assert request.engine_body["messages"] == messages
    assert all(a is b for a, b in zip(request.engine_body["messages"], messages, strict=True))  # not even copied
    assert request.options["images"] == ()


@pytest.mark.parametrize(
    ("message", "field", "words"),
    [
        ({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@@"}}]},
         "messages[0].content[0].image_url.url", "not valid base64"),
        ({"role": "user", "content": [{"type": "image_url", "image_url": {"url": f"data:image/gif;base64,{PNG_B64}"}}]},
         "messages[0].content[0].image_url.url", "declared as image/gif"),
        ({"role": "user", "content": [{"type": "image_url",
                                       "image_url": f"data:image/png;base64,{NOT_IMAGE_B64}"}]},
         "messages[0].content[0].image_url", "not a PNG"),
        ({"role": "user", "content": [{"type": "image_url"}]}, "messages[0].content[0].image_url", "required"),
        ({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "file:///etc/passwd"}}]},
         "messages[0].content[0].image_url.url", "http(s) URL"),
        ({"role": "assistant", "content": [{"type": "image_url", "image_url": {"url": PNG_URL}}]},
         "messages[0].content[0]", "only accepted in user messages"),
        ({"role": "tool", "tool_call_id": "c", "content": [{"type": "image_url", "image_url": {"url": PNG_URL}}]},
         "messages[0].content[0]", "only accepted in user messages"),
        ({"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}, "messages[0].content",
         "not supported"),
    ],
)  # fmt: skip
def test_chat_refusals_name_the_field(message: dict[str, Any], field: str, words: str) -> None:
    refused(openai_chat.normalize, chat(message), field, words)


# --- OpenAI Responses ----------------------------------------------------------------------------------------


def responses(*items: Any, **extra: Any) -> dict[str, Any]:
    return {"model": "m", "input": list(items), **extra}


def test_responses_input_images_are_taken_and_codex_details_dropped() -> None:
    body = responses(
        {"role": "user", "content": [
            {"type": "input_text", "text": "what"},
            {"type": "input_text", "text": "is this"},
            {"type": "input_image", "image_url": PNG_URL, "detail": "original"},  # as Codex sends
            {"type": "input_image", "image_url": REMOTE, "detail": "high"},
        ]},
        instructions="be brief",
    )  # fmt: skip
    request = openai_responses.normalize(body)
    assert request.engine_body["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [
            {"type": "text", "text": "what\nis this"},
            {"type": "image_url", "image_url": {"url": PNG_URL}},
            {"type": "image_url", "image_url": {"url": REMOTE, "detail": "high"}},
        ]},
    ]  # fmt: skip
    first, second = checked(request)
    assert (first.message_index, first.media_type, first.source, second.url) == (1, "image/png", "user", REMOTE)
    counted = openai_responses.count_tokens_request({"input": body["input"]})  # no instructions, no system message
    assert counted["messages"] == request.engine_body["messages"][1:]


def test_responses_tool_output_images_follow_the_turns_tool_messages() -> None:
    call = {"type": "function_call", "call_id": "c1", "name": "screenshot", "arguments": "{}"}
    body = responses(
        {"role": "user", "content": "look"},
        call,
        {**call, "call_id": "c2"},
        {"type": "function_call_output", "call_id": "c1", "output": [
            {"type": "input_text", "text": "shot 1"}, {"type": "input_image", "image_url": PNG_URL}]},
        {"type": "function_call_output", "call_id": "c2", "output": [
            {"type": "input_image", "image_url": JPEG_URL, "detail": "low"}]},
        {"type": "function_call", "call_id": "c3", "name": "screenshot", "arguments": "{}"},
        {"type": "custom_tool_call_output", "call_id": "c3", "output": [{"type": "input_image", "image_url": PNG_URL}]},
    )  # fmt: skip
    request = openai_responses.normalize(body)
    roles = [(m["role"], m.get("tool_call_id")) for m in request.engine_body["messages"]]
    assert roles == [("user", None), ("assistant", None), ("tool", "c1"), ("tool", "c2"), ("user", None),
                     ("assistant", None), ("tool", "c3"), ("user", None)]  # fmt: skip
    messages = request.engine_body["messages"]
    assert messages[2]["content"] == "shot 1" and messages[3]["content"] == ""  # the tool messages keep text only
    assert messages[4]["content"] == [
        {"type": "image_url", "image_url": {"url": PNG_URL}},
        {"type": "image_url", "image_url": {"url": JPEG_URL, "detail": "low"}},
    ]
    assert [(i.message_index, i.source) for i in checked(request)] == [(4, "tool_result")] * 2 + [(7, "tool_result")]


def test_responses_a_user_message_after_tool_images_stays_its_own() -> None:
    body = responses(
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": [{"type": "input_image", "image_url": PNG_URL}]},
        {"role": "user", "content": [{"type": "input_image", "image_url": JPEG_URL}]},
    )
    request = openai_responses.normalize(body)
    assert [m["role"] for m in request.engine_body["messages"]] == ["assistant", "tool", "user", "user"]
    assert [(i.message_index, i.source, i.media_type) for i in checked(request)] == [
        (2, "tool_result", "image/png"), (3, "user", "image/jpeg"),
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("items", "field", "words"),
    [
        ([{"role": "user", "content": [{"type": "input_image", "file_id": "file-1", "detail": "auto"}]}],
         "input[0].content[0].file_id", "no file store"),
        ([{"role": "user", "content": [{"type": "input_image", "image_url": "data:image/png;base64,A"}]}],
         "input[0].content[0].image_url", "not valid base64"),
        ([{"role": "user", "content": [{"type": "input_image", "image_url": f"data:image/webp;base64,{PNG_B64}"}]}],
         "input[0].content[0].image_url", "declared as image/webp"),
        ([{"role": "user", "content": [{"type": "input_image",
                                        "image_url": f"data:image/png;base64,{NOT_IMAGE_B64}"}]}],
         "input[0].content[0].image_url", "not a PNG"),
        ([{"role": "developer", "content": [{"type": "input_image", "image_url": PNG_URL}]}],
         "input[0].content[0]", "only accepted in user messages"),
        ([{"role": "assistant", "content": [{"type": "input_image", "image_url": PNG_URL}]}],
         "input[0].content[0]", "only accepted in user messages"),
        ([{"type": "function_call_output", "call_id": "c", "output": [{"type": "input_image", "image_url": "x"}]}],
         "input[0].output[0].image_url", "data URL"),
        ([{"type": "function_call_output", "call_id": "c", "output": [{"type": "input_file", "file_id": "f"}]}],
         "input[0].output[0]", "input_file is not supported"),
    ],
)  # fmt: skip
def test_responses_refusals_name_the_field(items: list[Any], field: str, words: str) -> None:
    refused(openai_responses.normalize, responses(*items), field, words)


def test_responses_without_images_normalises_as_before() -> None:
    request = openai_responses.normalize(responses({"role": "user", "content": [{"type": "input_text", "text": "a"}]}))
    assert request.engine_body["messages"] == [{"role": "user", "content": "a"}]
    assert request.options["images"] == ()


# --- Anthropic -----------------------------------------------------------------------------------------------


def b64_block(data: str = PNG_B64, media_type: str = "image/png") -> dict[str, Any]:
    return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}


def claude(*messages: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"model": "claude-x", "max_tokens": 5, "messages": list(messages), **extra}


TOOL_USE = {
    "role": "assistant",
    "content": [{"type": "tool_use", "id": f"t{n}", "name": "shot", "input": {}} for n in (1, 2)],
}


def test_anthropic_image_blocks_are_taken() -> None:
    body = claude(
        {"role": "user", "content": [b64_block(), {"type": "text", "text": "and"},
                                     {"type": "image", "source": {"type": "url", "url": REMOTE}},
                                     {"type": "text", "text": "what?"}]},
        system="be brief",
    )  # fmt: skip
    request = anthropic.normalize(body)
    assert request.engine_body["messages"][1]["content"] == [
        {"type": "image_url", "image_url": {"url": PNG_URL}},
        {"type": "text", "text": "and"},
        {"type": "image_url", "image_url": {"url": REMOTE}},
        {"type": "text", "text": "what?"},
    ]
    first, second = checked(request)
    assert (first.message_index, first.width, second.url, second.message_index) == (1, 3, REMOTE, 1)
    assert request.options["stop"] == []
    counted = anthropic.count_tokens_request(body)
    assert counted["messages"] == request.engine_body["messages"]


def test_anthropic_tool_result_images_follow_the_turns_tool_messages() -> None:
    body = claude(
        {"role": "user", "content": "take two screenshots"},
        TOOL_USE,
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "one"}, b64_block()]},
            {"type": "tool_result", "tool_use_id": "t2", "content": [b64_block(JPEG_B64, "image/jpeg")],
             "is_error": True},
            {"type": "text", "text": "compare them"},
        ]},
    )  # fmt: skip
    request = anthropic.normalize(body)
    messages = request.engine_body["messages"]
    assert [(m["role"], m.get("tool_call_id")) for m in messages] == [
        ("user", None), ("assistant", None), ("tool", "t1"), ("tool", "t2"), ("user", None),
    ]  # fmt: skip
    assert (messages[2]["content"], messages[3]["content"]) == ("one", "Error")
    assert messages[4]["content"] == [
        {"type": "image_url", "image_url": {"url": PNG_URL}},
        {"type": "image_url", "image_url": {"url": JPEG_URL}},
        {"type": "text", "text": "compare them"},
    ]
    assert [(i.message_index, i.source, i.media_type) for i in checked(request)] == [
        (4, "tool_result", "image/png"), (4, "tool_result", "image/jpeg"),
    ]  # fmt: skip


def test_anthropic_tool_result_images_without_user_text_get_their_own_message() -> None:
    body = claude(
        {"role": "user", "content": "go"},
        TOOL_USE,
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": [b64_block()]},
            {"type": "tool_result", "tool_use_id": "t2", "content": "plain"},
        ]},
    )  # fmt: skip
    request = anthropic.normalize(body)
    assert [m["role"] for m in request.engine_body["messages"]] == ["user", "assistant", "tool", "tool", "user"]
    assert request.engine_body["messages"][-1]["content"] == [{"type": "image_url", "image_url": {"url": PNG_URL}}]
    assert [i.message_index for i in checked(request)] == [4]


@pytest.mark.parametrize(
    ("content", "field", "words"),
    [
        ([b64_block("not base64!")], "messages[0].content[0].source.data", "not valid base64"),
        ([b64_block(PNG_B64, "image/jpeg")], "messages[0].content[0].source.data", "declared as image/jpeg"),
        ([b64_block(NOT_IMAGE_B64)], "messages[0].content[0].source.data", "not a PNG"),
        ([b64_block(BROKEN_PNG_B64)], "messages[0].content[0].source.data", "cannot be read"),
        ([{"type": "tool_result", "tool_use_id": "t", "content": [b64_block(NOT_IMAGE_B64)]}],
         "messages[0].content[0].content[0].source.data", "not a PNG"),
        ([{"type": "image", "source": {"type": "file", "file_id": "file_1"}}], "messages[0].content[0].source",
         "no file store"),
        ([{"type": "image", "source": {"type": "url", "url": "ftp://x"}}], "messages[0].content[0].source.url",
         "http(s)"),
        ([{"type": "image"}], "messages[0].content[0].source", "required"),
        ([{"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBE"}}],
         "messages[0].content[0]", "document input is not supported"),
        ([{"type": "tool_result", "tool_use_id": "t", "content": [{"type": "document", "source": {}}]}],
         "messages[0].content[0].content[0]", "document input is not supported"),
    ],
)  # fmt: skip
def test_anthropic_refusals_name_the_field(content: list[Any], field: str, words: str) -> None:
    refused(anthropic.normalize, claude({"role": "user", "content": content}), field, words)


def test_anthropic_images_outside_user_turns_are_refused() -> None:
    refused(anthropic.normalize, claude({"role": "assistant", "content": [b64_block()]}), "messages[0].content[0]",
            "only accepted in user messages")  # fmt: skip
    refused(anthropic.normalize, claude({"role": "user", "content": "x"}, system=[b64_block()]), "system[0]",
            "only accepted in user messages")  # fmt: skip


def test_anthropic_without_images_normalises_as_before() -> None:
    body = claude({"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]})
    request = anthropic.normalize(body)
    assert request.engine_body["messages"] == [{"role": "user", "content": "a\nb"}]
    assert request.options == {"stop": [], "images": ()}


# --- Gemini --------------------------------------------------------------------------------------------------


def inline(data: str = PNG_B64, mime: str | None = "image/png") -> dict[str, Any]:
    return {"inlineData": {"data": data, **({"mimeType": mime} if mime else {})}}


def gen(body: dict[str, Any]) -> ClientRequest:
    return gemini.normalize(body, RequestContext(path_params={"model": "gemini-x"}))


def test_gemini_inline_and_file_data_are_taken() -> None:
    body = {
        "contents": [
            {"role": "user", "parts": [{"text": "what"}, inline(), {"text": "and"},
                                       {"fileData": {"mimeType": "image/jpeg", "fileUri": "gs://bucket/cat.jpg"}}]},
        ],
        "systemInstruction": {"parts": [{"text": "be brief"}]},
    }  # fmt: skip
    request = gen(body)
    assert request.engine_body["messages"][1] == {"role": "user", "content": [
        {"type": "text", "text": "what"},
        {"type": "image_url", "image_url": {"url": PNG_URL}},
        {"type": "text", "text": "and"},
        {"type": "image_url", "image_url": {"url": "gs://bucket/cat.jpg"}},
    ]}  # fmt: skip
    first, second = checked(request)
    assert (first.message_index, first.media_type, first.height) == (1, "image/png", 2)
    assert (second.url, second.media_type, second.data, second.message_index) == (
        "gs://bucket/cat.jpg", "image/jpeg", None, 1,
    )  # fmt: skip
    assert gemini.count_tokens_request({"generateContentRequest": body})["messages"] == request.engine_body["messages"]


def test_gemini_function_response_images_follow_the_turns_tool_messages() -> None:
    calls = {"role": "model", "parts": [{"functionCall": {"id": "a", "name": "shot", "args": {}}},
                                        {"functionCall": {"id": "b", "name": "read", "args": {}}}]}  # fmt: skip
    body = {
        "contents": [
            {"role": "user", "parts": [{"text": "go"}]},
            calls,
            {"role": "user", "parts": [
                # the API's multimodal function response (snake_case, as google-genai sends it) ...
                {"functionResponse": {"id": "a", "name": "shot", "response": {"output": "ok"},
                                      "parts": [{"inline_data": {"mime_type": "image/png", "data": PNG_B64}}]}},
                {"functionResponse": {"id": "b", "name": "read", "response": {"output": "file"}}},
                inline(JPEG_B64, "image/jpeg"),  # ... and media beside the responses, as Gemini CLI sends a tool's
                {"text": "compare"},
            ]},
        ]
    }  # fmt: skip
    request = gen(body)
    messages = request.engine_body["messages"]
    assert [(m["role"], m.get("tool_call_id")) for m in messages] == [
        ("user", None), ("assistant", None), ("tool", "a"), ("tool", "b"), ("user", None),
    ]  # fmt: skip
    assert messages[2]["content"] == '{"output":"ok"}'
    assert messages[4]["content"] == [
        {"type": "image_url", "image_url": {"url": PNG_URL}},
        {"type": "image_url", "image_url": {"url": JPEG_URL}},
        {"type": "text", "text": "compare"},
    ]
    assert [(i.message_index, i.source) for i in checked(request)] == [(4, "tool_result"), (4, "tool_result")]


@pytest.mark.parametrize(
    ("parts", "field", "words"),
    [
        ([inline("@@@@")], "contents[0].parts[0].inlineData.data", "not valid base64"),
        ([inline(PNG_B64, "image/gif")], "contents[0].parts[0].inlineData.data", "declared as image/gif"),
        ([inline(NOT_IMAGE_B64, "application/pdf")], "contents[0].parts[0].inlineData.data", "not a PNG"),
        ([inline(BROKEN_PNG_B64)], "contents[0].parts[0].inlineData.data", "cannot be read"),
        ([{"inlineData": "x"}], "contents[0].parts[0].inlineData", "must be an object"),
        ([{"fileData": {"mimeType": "video/mp4", "fileUri": "gs://v"}}], "contents[0].parts[0].fileData.fileUri",
         "not supported"),
        ([{"fileData": {"mimeType": "image/png"}}], "contents[0].parts[0].fileData.fileUri", "required"),
        ([{"functionResponse": {"name": "f", "parts": [inline(NOT_IMAGE_B64)]}}],
         "contents[0].parts[0].functionResponse.parts[0].inlineData.data", "not a PNG"),
    ],
)  # fmt: skip
def test_gemini_refusals_name_the_field(parts: list[Any], field: str, words: str) -> None:
    refused(gen, {"contents": [{"role": "user", "parts": parts}]}, field, words)


def test_gemini_images_outside_user_turns_are_refused() -> None:
    body: dict[str, Any] = {"contents": [{"role": "user", "parts": [{"text": "x"}]},
                                         {"role": "model", "parts": [inline()]}]}  # fmt: skip
    refused(gen, body, "contents[1].parts[0]", "only accepted in user turns")
    body = {"contents": [{"parts": [{"text": "x"}]}], "systemInstruction": {"parts": [inline()]}}
    refused(gen, body, "systemInstruction.parts[0]", "text parts only")


def test_gemini_without_images_normalises_as_before() -> None:
    request = gen({"contents": [{"parts": [{"text": "a"}, {"text": "b"}]}]})
    assert request.engine_body["messages"] == [{"role": "user", "content": "a\nb"}]
    assert request.options["images"] == ()


# --- what the official SDKs send -----------------------------------------------------------------------------


def _sent(send: Any, transport_module: Any, status: int = 400) -> dict[str, Any]:
    """The JSON body ``send(http_client)`` makes its SDK post (answered with an error; no network)."""
    bodies: list[dict[str, Any]] = []

    def handler(request: Any) -> Any:
        bodies.append(json.loads(request.content))
        return transport_module.Response(status, json={"error": {"code": status, "message": "captured"}})

    with pytest.raises(Exception, match=r"captured|400"):
        send(transport_module.Client(transport=transport_module.MockTransport(handler)))
    return bodies[-1]


def test_what_the_openai_sdk_sends_is_taken() -> None:
    def client(http: httpx2.Client) -> openai_sdk.OpenAI:
        return openai_sdk.OpenAI(api_key="k", base_url="http://proxy/v1", max_retries=0, http_client=http)

    parts: Any = [{"type": "text", "text": "what"},
                  {"type": "image_url", "image_url": {"url": PNG_URL, "detail": "low"}}]  # fmt: skip
    body = _sent(lambda http: client(http).chat.completions.create(
        model="m", messages=[{"role": "user", "content": parts}]), httpx2)  # fmt: skip
    assert [i.media_type for i in checked(openai_chat.normalize(body))] == ["image/png"]

    items: Any = [
        {"role": "user", "content": [{"type": "input_image", "image_url": JPEG_URL, "detail": "original"}]},
        {"type": "function_call", "call_id": "c", "name": "shot", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c",
         "output": [{"type": "input_text", "text": "done"}, {"type": "input_image", "image_url": PNG_URL,
                                                              "detail": "auto"}]},
    ]  # fmt: skip
    body = _sent(lambda http: client(http).responses.create(model="m", input=items), httpx2)
    request = openai_responses.normalize(body)
    assert [(i.message_index, i.source) for i in checked(request)] == [(0, "user"), (3, "tool_result")]
    assert image_parts(request)[1][1] == {"type": "image_url", "image_url": {"url": PNG_URL, "detail": "auto"}}


def test_what_the_anthropic_sdk_sends_is_taken() -> None:
    def client(http: httpx2.Client) -> anthropic_sdk.Anthropic:
        return anthropic_sdk.Anthropic(api_key="k", base_url="http://proxy", max_retries=0, http_client=http)

    messages: Any = [
        {"role": "user", "content": [b64_block(), {"type": "text", "text": "shoot"}]},
        TOOL_USE,
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": [b64_block(JPEG_B64, "image/jpeg")]},
            {"type": "tool_result", "tool_use_id": "t2", "content": [{"type": "text", "text": "-"}]},
        ]},
    ]  # fmt: skip
    body = _sent(lambda http: client(http).messages.create(model="m", max_tokens=5, messages=messages), httpx2)
    request = anthropic.normalize(body)
    assert [(i.message_index, i.source, i.media_type) for i in checked(request)] == [
        (0, "user", "image/png"), (4, "tool_result", "image/jpeg"),
    ]  # fmt: skip
    counted = _sent(lambda http: client(http).messages.count_tokens(model="m", messages=messages), httpx2)
    assert anthropic.count_tokens_request(counted)["messages"] == request.engine_body["messages"]


def test_what_google_genai_sends_is_taken() -> None:
    """google-genai sends bytes as URL-safe base64, and snake_case names inside ``inlineData`` and inside
    ``functionResponse.parts``."""
    plus = next(png for shade in range(256) if "+" in base64.b64encode(png := encoded(colour=(shade, 250, 7))).decode())
    part = genai_types.Part.from_bytes(data=plus, mime_type="image/png")
    assert part.model_dump(by_alias=True, exclude_none=True, mode="json")["inlineData"]["data"] == (
        base64.urlsafe_b64encode(plus).decode()
    )

    def client(http: httpx.Client) -> genai.Client:
        return genai.Client(api_key="k", http_options=genai_types.HttpOptions(base_url="http://proxy",
                                                                               httpx_client=http))  # fmt: skip

    response = genai_types.Part.from_function_response(
        name="shot", response={"output": "ok"},
        parts=[genai_types.FunctionResponsePart.from_bytes(data=JPEG, mime_type="image/jpeg")],
    )  # fmt: skip
    call = genai_types.Part(function_call=genai_types.FunctionCall(name="shot", args={}))
    contents: Any = [
        genai_types.Content(role="user", parts=[part, genai_types.Part.from_text(text="what"),
                                                genai_types.Part.from_uri(file_uri=REMOTE, mime_type="image/png")]),
        genai_types.Content(role="model", parts=[call]),
        genai_types.Content(role="user", parts=[response]),
    ]  # fmt: skip
    body = _sent(lambda http: client(http).models.generate_content(model="m", contents=contents), httpx)
    sent = body["contents"][0]["parts"][0]["inlineData"]
    assert "-" in sent["data"] and "mime_type" in sent  # the wire facts the decoding relies on
    request = gen(body)
    listed = checked(request)
    assert [(i.message_index, i.source, i.media_type) for i in listed] == [
        (0, "user", "image/png"), (0, "user", "image/png"), (3, "tool_result", "image/jpeg"),
    ]  # fmt: skip
    assert listed[0].data == plus and listed[1].url == REMOTE and listed[2].data == JPEG

    counted = _sent(lambda http: client(http).models.count_tokens(model="m", contents=contents), httpx)
    assert gemini.count_tokens_request(counted)["messages"] == request.engine_body["messages"]
