"""``polar.protocols.openai_chat`` on recorded payloads: normalising, rendering, the chunk stream, errors."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from polar.errors import ValidationError
from polar.protocols import detect, openai_chat
from polar.protocols._base import EngineAnswer

ENGINE_ANSWER: dict[str, Any] = {
    "id": "chatcmpl-abc",
    "object": "chat.completion",
    "created": 1,
    "model": "polar-reference",
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": "\n\n",
                "reasoning": "add them",
                "reasoning_content": "add them",
                "tool_calls": [
                    {"id": "chatcmpl-tool-1", "type": "function",
                     "function": {"name": "calculator", "arguments": "{\"expression\": \"1+2\"}"}}
                ],
            },
            "logprobs": {"content": [{"token": "a", "logprob": -0.5, "bytes": [97], "top_logprobs": []}]},
            "finish_reason": "tool_calls",
            "stop_reason": None,
            "token_ids": [5, 6, 7],
        }
    ],
    "usage": {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13},
    "prompt_token_ids": list(range(10)),
}  # fmt: skip


def request(**extra: Any) -> dict[str, Any]:
    return {"model": "gpt-x", "messages": [{"role": "user", "content": "hi"}], **extra}


def test_normalize_forwards_what_the_engine_takes_and_drops_vendor_extras() -> None:
    body = request(temperature=0.3, store=True, metadata={"a": 1}, max_completion_tokens=10**9, stop=["\n"])
    normalized = openai_chat.normalize(body)
    assert normalized.model == "gpt-x" and not normalized.stream
    assert normalized.engine_body == {
        "messages": [{"role": "user", "content": "hi"}],
        "max_completion_tokens": openai_chat.MAX_OUTPUT_TOKENS,
        "temperature": 0.3,
        "stop": ["\n"],
    }


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"messages": [{"role": "user", "content": "x"}]}, "model"),
        (request(messages=[]), "messages"),
        (request(messages="hi"), "messages"),
        (request(messages=[{"role": "robot", "content": "x"}]), "messages[0].role"),
        (request(messages=[{"role": "user", "content": 5}]), "messages[0].content"),
        (request(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]),
         "messages[0].content[0].image_url.url"),
        (request(messages=[{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]),
         "messages[0].content"),
        (request(stream="yes"), "stream"),
        (request(max_tokens=0), "max_tokens"),
        (request(n=2), "n"),
        (request(stream_options={"include_usage": True}), "stream_options"),
        (request(tool_choice="sometimes"), "tool_choice"),
    ],
)  # fmt: skip
def test_bad_requests_name_the_field(body: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as caught:
        openai_chat.normalize(body)
    assert caught.value.field == field


def test_audio_and_file_input_say_they_are_not_supported() -> None:
    for kind in ("input_audio", "file"):
        with pytest.raises(ValidationError, match=f"{kind} input is not supported"):
            openai_chat.normalize(request(messages=[{"role": "user", "content": [{"type": kind}]}]))


def test_render_response_echoes_the_model_and_hides_capture_fields() -> None:
    rendered = openai_chat.render_response(openai_chat.normalize(request()), EngineAnswer(ENGINE_ANSWER))
    assert rendered["model"] == "gpt-x"
    assert "prompt_token_ids" not in rendered and "token_ids" not in rendered["choices"][0]
    assert rendered["choices"][0]["logprobs"] is None
    assert rendered["choices"][0]["message"]["tool_calls"][0]["id"] == "chatcmpl-tool-1"


def test_capture_fields_stay_for_clients_that_ask() -> None:
    body = request(return_token_ids=True, logprobs=True)
    rendered = openai_chat.render_response(openai_chat.normalize(body), EngineAnswer(ENGINE_ANSWER))
    assert rendered["prompt_token_ids"] == list(range(10)) and rendered["choices"][0]["token_ids"] == [5, 6, 7]
    assert rendered["choices"][0]["logprobs"]["content"][0]["logprob"] == -0.5


def test_stream_order_tool_call_deltas_usage_and_done() -> None:
    normalized = openai_chat.normalize(request(stream=True, stream_options={"include_usage": True}))
    events = [e.decode() for e in openai_chat.render_stream(normalized, EngineAnswer(ENGINE_ANSWER))]
    assert all(e.startswith("data: ") and e.endswith("\n\n") for e in events)
    assert events[-1] == "data: [DONE]\n\n"
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert {"reasoning_content": "add them"} in deltas
    calls = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    assert calls[0]["id"] == "chatcmpl-tool-1" and calls[0]["function"] == {"name": "calculator", "arguments": ""}
    assert calls[1]["function"]["arguments"] == '{"expression": "1+2"}'
    assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] == 13
    assert all(c["model"] == "gpt-x" and c["object"] == "chat.completion.chunk" for c in chunks)


def test_errors_and_stream_errors_have_openai_shape() -> None:
    assert openai_chat.render_error(401, "nope")["error"] == {
        "message": "nope", "type": "invalid_request_error", "param": None, "code": "invalid_api_key"
    }  # fmt: skip
    assert openai_chat.render_error(502, "down")["error"]["type"] == "server_error"
    # OpenAI's own 429: a rate-limit type ("requests" / "tokens") with code "rate_limit_exceeded".
    assert openai_chat.render_error(429, "slow down")["error"] == {
        "message": "slow down", "type": "requests", "param": None, "code": "rate_limit_exceeded"
    }  # fmt: skip
    event = openai_chat.render_stream_error(500, "boom").decode()
    assert json.loads(event[6:])["error"]["message"] == "boom"


def test_detection_by_path_header_and_body() -> None:
    assert detect("POST", "/v1/chat/completions", {}, {}).protocol is openai_chat  # type: ignore[union-attr]
    models = detect("GET", "/v1/models", {"anthropic-version": "2023-06-01"}, {})
    assert models is not None and models.protocol.PROVIDER == "anthropic"
    assert detect("GET", "/v1/models", {}, {}).protocol is openai_chat  # type: ignore[union-attr]
    by_body = detect("POST", "/custom/path", {}, {}, {"messages": [], "model": "m"})
    assert by_body is not None and by_body.protocol is openai_chat
    assert detect("POST", "/custom/path", {}, {}, None) is None


def test_normalize_sends_an_assistants_reasoning_content_as_reasoning() -> None:
    messages = [
        {"role": "user", "content": "hi", "reasoning_content": "not an assistant's"},
        {"role": "assistant", "content": "a", "reasoning_content": "old name"},
        {"role": "assistant", "content": "b", "reasoning": "kept", "reasoning_content": "dropped"},
        {"role": "assistant", "content": "c", "reasoning": None, "reasoning_content": "fills a null"},
        {"role": "assistant", "content": "d", "reasoning": "untouched"},
        {"role": "tool", "content": "e", "tool_call_id": "1", "reasoning_content": "not an assistant's"},
    ]
    body = request(messages=messages)
    before = copy.deepcopy(body)
    sent = openai_chat.normalize(body).engine_body["messages"]
    assert sent == [
        messages[0],
        {"role": "assistant", "content": "a", "reasoning": "old name"},
        {"role": "assistant", "content": "b", "reasoning": "kept"},
        {"role": "assistant", "content": "c", "reasoning": "fills a null"},
        messages[4],
        messages[5],
    ]
    assert body == before  # the client's body stays as it came
