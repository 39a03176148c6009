"""Anthropic Messages through the live proxy with the official ``anthropic`` SDK: tool loops with thinking
(streaming and not, Claude Code's changing billing line in ``system``), count tokens, prefill, stop sequences,
max tokens, thinking off, models, ``HEAD /`` and bad input. Every captured call is checked token for token."""

from __future__ import annotations

import itertools
import json
import uuid
from typing import Any

import anthropic
import httpx
import pytest

from polar.storage.calls.read import chat_form
from tests.live_proxy import LiveProxy
from tests.processes import HANG_GUARD_S

TURNS = [
    {"reasoning": "I should check the weather.",
     "tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]},
    {"reasoning": "The tool answered.", "content": "It is sunny in Paris. STOP here."},
    {"content": "Paris is sunny today."},
]  # fmt: skip
TOOLS: list[Any] = [
    {"name": "get_weather", "description": "Weather for a city",
     "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
]  # fmt: skip
THINKING: Any = {"type": "enabled", "budget_tokens": 1024}
MODEL = "claude-polar-test"


def _client(proxy: LiveProxy, key: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=proxy.base(key), api_key=key, max_retries=0)


def _system() -> list[Any]:
    """Claude Code's system blocks: a billing line that differs on every call, then the real prompt."""
    salt = uuid.uuid4().hex
    billing = f"x-anthropic-billing-header: cc_version=2.1.77.{salt[:3]}; cc_entrypoint=cli; cch={salt[3:8]};"
    return [{"type": "text", "text": billing},
            {"type": "text", "text": "You are a weather agent.", "cache_control": {"type": "ephemeral"}}]  # fmt: skip


def _check_calls(proxy: LiveProxy, session_id: Any, count: int) -> list[dict[str, Any]]:
    """Each call's ids are the engine's own, and its normalised request tokenises to exactly its prompt."""
    calls = proxy.calls(session_id)
    entries = proxy.engine_entries()
    assert len(calls) == count
    for call in calls:
        logged = proxy.logged(entries, call)
        assert call["provider"] == "anthropic" and call["model"] == MODEL and call["status_code"] == 200
        assert call["completion_token_ids"] == logged["token_ids"]
        assert call["prompt_token_ids"] == logged["prompt_token_ids"]
        assert call["prompt_token_ids"] == proxy.prompt_ids(call["normalized_request"])
        assert len(call["logprobs"]) == len(call["completion_token_ids"])
    return calls


def _assert_chained(calls: list[dict[str, Any]]) -> None:
    """Turn k+1's prompt starts with turn k's prompt and sampled tokens: the billing line did not break it."""
    for before, after in itertools.pairwise(calls):
        sent = before["prompt_token_ids"] + before["completion_token_ids"]
        assert after["prompt_token_ids"][: len(sent)] == sent


def _tool_loop_turn(message: Any) -> list[dict[str, Any]]:
    """The assistant turn as history plus the user's tool results, as an agent sends them back."""
    assert message.stop_reason == "tool_use" and message.model == MODEL and message.id.startswith("msg_")
    assert [block.type for block in message.content] == ["thinking", "tool_use"]
    assert message.content[0].thinking == "I should check the weather." and message.content[0].signature
    call = message.content[1]
    assert call.name == "get_weather" and call.input == {"city": "Paris"} and call.id.startswith("chatcmpl-tool-")
    results = [{"type": "tool_result", "tool_use_id": call.id, "content": [{"type": "text", "text": "sunny, 24C"}]}]
    return [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in message.content]},
            {"role": "user", "content": results}]  # fmt: skip


def test_tool_loop_with_thinking(proxy: LiveProxy) -> None:
    session_id, key = proxy.session()
    client = _client(proxy, key)
    messages: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = client.messages.create(
        model=MODEL, max_tokens=20000, system=_system(), messages=messages, tools=TOOLS, thinking=THINKING,
        tool_choice={"type": "auto"}, metadata={"user_id": "u1"},
    )  # fmt: skip
    messages += _tool_loop_turn(first)
    counted = client.messages.count_tokens(
        model=MODEL, system=_system(), messages=messages, tools=TOOLS, thinking=THINKING
    )
    second = client.messages.create(
        model=MODEL, max_tokens=20000, system=_system(), messages=messages, tools=TOOLS, thinking=THINKING
    )
    assert second.stop_reason == "end_turn" and second.stop_sequence is None
    assert [block.type for block in second.content] == ["thinking", "text"]
    assert second.content[1].text == "It is sunny in Paris. STOP here."  # type: ignore[union-attr]
    calls = _check_calls(proxy, session_id, 2)
    _assert_chained(calls)
    assert counted.input_tokens == second.usage.input_tokens == len(calls[1]["prompt_token_ids"])
    assert first.usage.output_tokens == len(calls[0]["completion_token_ids"])
    assert chat_form(calls[0]["normalized_request"])["messages"][0] == {
        "role": "system",
        "content": "You are a weather agent.",
    }


def test_streaming_tool_loop(proxy: LiveProxy) -> None:
    session_id, key = proxy.session()
    client = _client(proxy, key)
    messages: list[Any] = [{"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]}]
    with client.messages.stream(
        model=MODEL, max_tokens=2048, system=_system(), messages=messages, tools=TOOLS, thinking=THINKING
    ) as stream:
        kinds = [event.type for event in stream]
        first = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop" and "input_json" in kinds
    messages += _tool_loop_turn(first)
    with client.messages.stream(
        model=MODEL, max_tokens=2048, system=_system(), messages=messages, tools=TOOLS, thinking=THINKING
    ) as stream:
        text = "".join(stream.text_stream)
        second = stream.get_final_message()
    assert text == "It is sunny in Paris. STOP here."
    assert second.stop_reason == "end_turn" and second.content[0].type == "thinking"
    calls = _check_calls(proxy, session_id, 2)
    assert [call["stream"] for call in calls] == [True, True]
    _assert_chained(calls)
    assert second.usage.input_tokens == len(calls[1]["prompt_token_ids"])
    assert second.usage.output_tokens == len(calls[1]["completion_token_ids"])


def test_prefill_stop_sequences_max_tokens_and_thinking_off(proxy: LiveProxy) -> None:
    session_id, key = proxy.session()
    client = _client(proxy, key)
    after_tool: list[Any] = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_01", "name": "get_weather",
                                           "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01", "content": "sunny"}]},
    ]  # fmt: skip
    stopped = client.messages.create(
        model=MODEL, max_tokens=256, messages=after_tool, tools=TOOLS, stop_sequences=["STOP"]
    )
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == "STOP"
    assert stopped.content[-1].text == "It is sunny in Paris. "  # type: ignore[union-attr]
    raw = httpx.post(
        f"{proxy.base(key)}/v1/messages?beta=true", headers={"anthropic-version": "2023-06-01", "x-api-key": key},
        json={"model": MODEL, "max_tokens": 256, "messages": after_tool, "stop_sequences": ["STOP"], "stream": True},
        timeout=HANG_GUARD_S,
    )  # fmt: skip
    assert raw.headers["content-type"].startswith("text/event-stream")
    sse = [chunk.split("\n") for chunk in raw.text.split("\n\n") if chunk]
    assert [lines[0] for lines in sse] == [f"event: {kind}" for kind in (
        "message_start", "ping", "content_block_start", "content_block_delta", "content_block_delta",
        "content_block_stop", "content_block_start", "content_block_delta", "content_block_stop", "message_delta",
        "message_stop")]  # fmt: skip
    assert json.loads(sse[-2][1][6:])["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "STOP"}

    prefill: list[Any] = [
        {"role": "user", "content": "a"}, {"role": "assistant", "content": "one"},
        {"role": "user", "content": "b"}, {"role": "assistant", "content": "two"},
        {"role": "user", "content": "c"}, {"role": "assistant", "content": "Paris is"},
    ]  # fmt: skip
    sampling = {"temperature": 0.5, "top_p": 0.9, "top_k": 5}  # older SDKs' keyword arguments
    continued = client.messages.create(model=MODEL, max_tokens=256, messages=prefill, extra_body=sampling)
    assert continued.stop_reason == "end_turn"
    assert [block.type for block in continued.content] == ["text"]
    assert continued.content[0].text == " sunny today."  # type: ignore[union-attr]
    counted = client.messages.count_tokens(model=MODEL, messages=prefill)

    cut = client.messages.create(model=MODEL, max_tokens=3, messages=[{"role": "user", "content": "hi"}])
    assert cut.stop_reason == "max_tokens" and cut.usage.output_tokens == 3

    plain = client.messages.create(
        model=MODEL, max_tokens=256, messages=[{"role": "user", "content": "hi"}], tools=TOOLS,
        thinking={"type": "disabled"}, tool_choice={"type": "tool", "name": "get_weather"},
    )  # fmt: skip
    assert [block.type for block in plain.content] == ["tool_use"] and plain.stop_reason == "tool_use"

    calls = _check_calls(proxy, session_id, 5)
    assert counted.input_tokens == len(calls[2]["prompt_token_ids"])
    assert chat_form(calls[2]["normalized_request"])["continue_final_message"] is True
    assert chat_form(calls[4]["normalized_request"])["chat_template_kwargs"] == {"enable_thinking": False}


def test_models_head_and_bad_input(proxy: LiveProxy) -> None:
    session_id, key = proxy.session()
    client = _client(proxy, key)
    assert [model.id for model in client.models.list()] == ["polar-reference"]
    listed = httpx.get(
        f"{proxy.base(key)}/v1/models", headers={"anthropic-version": "2023-06-01"}, timeout=HANG_GUARD_S
    ).json()
    assert listed["data"][0]["type"] == "model" and listed["has_more"] is False
    assert listed["first_id"] == listed["last_id"] == "polar-reference"
    assert httpx.head(f"{proxy.base(key)}/", timeout=HANG_GUARD_S).status_code == 200
    assert httpx.head(f"{proxy.base(key)}/?beta=true", timeout=HANG_GUARD_S).status_code == 200

    def bad_request(body: dict[str, Any]) -> anthropic.BadRequestError:
        with pytest.raises(anthropic.BadRequestError) as caught:
            client.post("/v1/messages?beta=true", cast_to=anthropic.types.Message, body=body)
        assert caught.value.status_code == 400
        assert caught.value.body["type"] == "error"  # type: ignore[index]
        assert caught.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
        return caught.value

    hi = [{"role": "user", "content": "hi"}]
    assert "max_tokens" in str(bad_request({"model": MODEL, "messages": hi}))
    assert "messages" in str(bad_request({"model": MODEL, "max_tokens": 5, "messages": "hi"}))
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    assert "messages[0].content[0].source.data: the image cannot be read" in str(
        bad_request({"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": [image]}]})
    )
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(model=MODEL, max_tokens=5, messages="hi")  # type: ignore[arg-type]

    raw = httpx.post(
        f"{proxy.base(key)}/v1/messages",
        content=b"{oops",
        headers={"content-type": "application/json"},
        timeout=HANG_GUARD_S,
    )
    assert raw.status_code == 400
    assert raw.json()["type"] == "error" and raw.json()["error"]["type"] == "invalid_request_error"
    assert raw.json()["request_id"].startswith("req_")

    unknown = anthropic.Anthropic(base_url=proxy.base("pk-nope"), api_key="pk-nope", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as denied:
        unknown.messages.create(model=MODEL, max_tokens=5, messages=hi)  # type: ignore[arg-type]
    assert denied.value.status_code == 401 and "unknown proxy key" in str(denied.value)
    assert denied.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
    with pytest.raises(anthropic.AuthenticationError):
        unknown.messages.count_tokens(model=MODEL, messages=hi)  # type: ignore[arg-type]

    bare = anthropic.Anthropic(base_url=proxy.url, api_key=key, max_retries=0)  # key as x-api-key only
    reply = bare.messages.create(model=MODEL, max_tokens=512, messages=hi)  # type: ignore[arg-type]
    assert reply.stop_reason == "end_turn" and [block.type for block in reply.content] == ["thinking"]
    assert len(proxy.calls(session_id)) == 1
