"""Gemini conformance through the live proxy with the official ``google-genai`` SDK: tool loops (streaming and
not, ``parametersJsonSchema`` and OpenAPI ``parameters``), thoughts, count_tokens, MAX_TOKENS, prefill, model
list, errors the SDK raises as ``errors.ClientError`` — and the captured tokens checked against the engine."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from google import genai
from google.genai import errors, types

from polar.storage.calls.read import chat_form
from tests.live_proxy import LiveProxy
from tests.processes import HANG_GUARD_S

MODEL = "gemini-2.5-flash"
TURNS = {
    "turns": [
        {
            "reasoning": "I should look up the weather.",
            "tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}],
        },
        {"reasoning": "The tool says sunny.", "content": "It is sunny in Paris."},
    ]
}
WEATHER_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def _client(proxy: LiveProxy, key: str, version: str = "v1beta") -> genai.Client:
    options = types.HttpOptions(base_url=proxy.base(key), api_version=version)
    return genai.Client(api_key=key, http_options=options)


def _config(**extra: Any) -> types.GenerateContentConfig:
    return types.GenerateContentConfig(
        automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True), **extra
    )


def _weather_tool(openapi: bool) -> types.Tool:
    if openapi:
        schema = types.Schema(type="OBJECT", properties={"city": types.Schema(type="STRING")}, required=["city"])
        declaration = types.FunctionDeclaration(name="get_weather", description="Weather for a city", parameters=schema)
    else:
        declaration = types.FunctionDeclaration(
            name="get_weather", description="Weather for a city", parameters_json_schema=WEATHER_SCHEMA
        )
    return types.Tool(function_declarations=[declaration])


def _check_tokens(proxy: LiveProxy, calls: list[dict[str, Any]]) -> None:
    """Captured ids equal the engine's own log, and re-tokenising the normalised request gives the prompt."""
    entries = proxy.engine_entries()
    for call in calls:
        entry = proxy.logged(entries, call)
        assert call["prompt_token_ids"] == entry["prompt_token_ids"]
        assert call["completion_token_ids"] == entry["token_ids"]
        assert proxy.prompt_ids(call["normalized_request"]) == call["prompt_token_ids"]


def _tool_messages(call: dict[str, Any]) -> tuple[list[str], list[str]]:
    messages = chat_form(call["normalized_request"])["messages"]
    called = [c["id"] for m in messages if m["role"] == "assistant" for c in m.get("tool_calls") or []]
    answered = [m["tool_call_id"] for m in messages if m["role"] == "tool"]
    return called, answered


def test_tool_loop(proxy: LiveProxy) -> None:
    session_id, key = proxy.session()
    client = _client(proxy, key)
    config = _config(
        tools=[_weather_tool(openapi=False)],
        system_instruction="You are terse.",
        thinking_config=types.ThinkingConfig(include_thoughts=True),
    )
    contents: list[Any] = [types.Content(role="user", parts=[types.Part.from_text(text="Weather in Paris?")])]
    first = client.models.generate_content(model=MODEL, contents=contents, config=config)
    assert first.model_version == MODEL and first.response_id.startswith("chatcmpl-")
    candidate = first.candidates[0]
    assert candidate.finish_reason == types.FinishReason.STOP
    parts = candidate.content.parts
    assert parts[0].thought and parts[0].text == "I should look up the weather."
    call = first.function_calls[0]
    assert (call.name, call.args) == ("get_weather", {"city": "Paris"}) and call.id.startswith("chatcmpl-tool-")
    usage = first.usage_metadata
    assert usage.thoughts_token_count > 0 and usage.candidates_token_count > 0
    assert (
        usage.total_token_count == usage.prompt_token_count + usage.candidates_token_count + usage.thoughts_token_count
    )

    contents.append(candidate.content)
    result = types.Part.from_function_response(name="get_weather", response={"forecast": "sunny"})
    result.function_response.id = call.id
    contents.append(types.Content(role="user", parts=[result]))
    second = client.models.generate_content(model=MODEL, contents=contents, config=config)
    assert second.text == "It is sunny in Paris." and not second.function_calls
    assert [p.thought for p in second.candidates[0].content.parts] == [True, None]

    calls = proxy.calls(session_id)
    assert [(c["provider"], c["model"], c["stream"], c["finish_reason"]) for c in calls] == [
        ("gemini", MODEL, False, "tool_calls"),
        ("gemini", MODEL, False, "stop"),
    ]
    assert _tool_messages(calls[1]) == ([call.id], [call.id])
    assert chat_form(calls[1]["normalized_request"])["messages"][-1]["content"] == '{"forecast":"sunny"}'
    assert chat_form(calls[1]["normalized_request"])["messages"][2]["reasoning"] == "I should look up the weather."
    # Thoughts shown and sent back: the first turn's prompt and sampled tokens are a prefix of the second prompt.
    sampled = calls[0]["prompt_token_ids"] + calls[0]["completion_token_ids"]
    assert calls[1]["prompt_token_ids"][: len(sampled)] == sampled
    _check_tokens(proxy, calls)


def test_streamed_tool_loop_with_openapi_schema(proxy: LiveProxy) -> None:
    session_id, key = proxy.session()
    client = _client(proxy, key)
    config = _config(tools=[_weather_tool(openapi=True)])
    contents: list[Any] = [types.Content(role="user", parts=[types.Part.from_text(text="Weather in Paris?")])]
    chunks = list(client.models.generate_content_stream(model=MODEL, contents=contents, config=config))
    assert all(chunk.model_version == MODEL for chunk in chunks)
    assert [c.candidates[0].finish_reason for c in chunks][-1] == types.FinishReason.STOP
    assert all(c.candidates[0].finish_reason is None and c.usage_metadata is None for c in chunks[:-1])
    assert chunks[-1].usage_metadata.prompt_token_count > 0
    assert not any(p.thought for c in chunks for p in c.candidates[0].content.parts)  # thoughts not asked for
    call = next(fc for chunk in chunks for fc in chunk.function_calls or [])
    assert call.args == {"city": "Paris"}

    model_parts = [part for chunk in chunks for part in chunk.candidates[0].content.parts]
    contents.append(types.Content(role="model", parts=model_parts))
    # No id on the response: the proxy pairs it with the call by name.
    contents.append(
        types.Content(role="user", parts=[types.Part.from_function_response(name="get_weather", response={"t": 21})])
    )
    streamed = list(client.models.generate_content_stream(model=MODEL, contents=contents, config=config))
    assert "".join(c.text or "" for c in streamed) == "It is sunny in Paris."
    assert streamed[-1].candidates[0].finish_reason == types.FinishReason.STOP

    calls = proxy.calls(session_id)
    assert [c["stream"] for c in calls] == [True, True]
    tools = chat_form(calls[0]["normalized_request"])["tools"]
    assert tools[0]["function"]["parameters"] == WEATHER_SCHEMA
    assert _tool_messages(calls[1]) == ([call.id], [call.id])
    _check_tokens(proxy, calls)


def test_count_tokens_max_tokens_prefill_and_models(proxy: LiveProxy) -> None:
    session_id, key = proxy.session()
    client = _client(proxy, key)
    contents = [types.Content(role="user", parts=[types.Part.from_text(text="Weather in Paris?")])]
    counted = client.models.count_tokens(model=MODEL, contents=contents)

    short = client.models.generate_content(model=MODEL, contents=contents, config=_config(max_output_tokens=3))
    assert short.candidates[0].finish_reason == types.FinishReason.MAX_TOKENS
    assert short.usage_metadata.prompt_token_count == counted.total_tokens
    assert short.usage_metadata.candidates_token_count + short.usage_metadata.thoughts_token_count == 3

    prefill = [*contents, types.Content(role="model", parts=[types.Part.from_text(text="It is")])]
    continued = client.models.generate_content(model=MODEL, contents=prefill, config=_config())
    assert continued.candidates[0].finish_reason == types.FinishReason.STOP

    no_thinking = _config(thinking_config=types.ThinkingConfig(thinking_budget=0), stop_sequences=["sunny"])
    plain = client.models.generate_content(model=MODEL, contents=contents, config=no_thinking)
    assert plain.usage_metadata.thoughts_token_count == 0

    calls = proxy.calls(session_id)
    assert proxy.sampling(calls[0], "max_tokens") == 3
    assert chat_form(calls[1]["normalized_request"])["continue_final_message"] is True
    assert chat_form(calls[2]["normalized_request"])["chat_template_kwargs"] == {"enable_thinking": False}
    assert proxy.sampling(calls[2], "stop") == ["sunny"]
    _check_tokens(proxy, calls)

    assert [m.name for m in client.models.list()] == ["models/polar-reference"]
    v1 = _client(proxy, key, version="v1")
    assert v1.models.generate_content(model=MODEL, contents="hi", config=_config()).candidates[0].content.parts


def test_errors(proxy: LiveProxy) -> None:
    _, key = proxy.session()
    client = _client(proxy, key)
    stranger = _client(proxy, "pk-nope")  # kept in a variable: a collected Client closes its connection pool
    with pytest.raises(errors.ClientError) as unknown:
        stranger.models.generate_content(model=MODEL, contents="hi")
    assert unknown.value.code == 401 and unknown.value.status == "UNAUTHENTICATED"
    with pytest.raises(errors.ClientError) as empty:
        client.models.generate_content(model=MODEL, contents=[types.Content(role="user", parts=[])])
    assert empty.value.code == 400 and empty.value.status == "INVALID_ARGUMENT" and "parts" in empty.value.message
    with pytest.raises(errors.ClientError) as role:
        client.models.generate_content(model=MODEL, contents=[types.Content(role="system", parts=[{"text": "x"}])])
    assert role.value.code == 400 and "role" in role.value.message
    with pytest.raises(errors.ClientError) as image:
        client.models.generate_content(
            model=MODEL, contents=[types.Part.from_bytes(data=b"\x89PNG", mime_type="image/png"), "what is this?"]
        )
    # A malformed image: the protocol's 400 naming the part (images are taken: tests/e2e/test_images_sdks.py).
    assert image.value.code == 400 and "contents[0].parts[0].inlineData.data" in image.value.message
    with pytest.raises(errors.ClientError) as search:
        client.models.generate_content(
            model=MODEL, contents="news?", config=_config(tools=[types.Tool(google_search=types.GoogleSearch())])
        )
    assert search.value.code == 400 and "googleSearch" in search.value.message

    url = f"{proxy.base(key)}/v1beta/models/{MODEL}:generateContent"
    cases = [
        (b"{oops", "not valid JSON"),
        (b'{"contents": [{"parts": [{"text": "x"}]}], "generationConfig": {"temperature": Infinity}}', "Infinity"),
        (json.dumps({"contents": [{"role": "model", "parts": []}]}).encode(), "contents"),
        (json.dumps({"generationConfig": {}}).encode(), "contents"),
        (json.dumps({"contents": "hi"}).encode(), "contents"),
        (json.dumps({"contents": [{"role": "system", "parts": [{"text": "x"}]}]}).encode(), "role"),
        (json.dumps({"contents": [{"parts": [{"text": 3}]}]}).encode(), "text"),
        (
            json.dumps(
                {"contents": [{"parts": [{"text": "x"}]}], "generationConfig": {"maxOutputTokens": "9"}}
            ).encode(),
            "maxOutputTokens",
        ),
    ]
    for raw, needle in cases:
        reply = httpx.post(url, content=raw, headers={"content-type": "application/json"}, timeout=HANG_GUARD_S)
        error = reply.json()["error"]
        assert (reply.status_code, error["code"], error["status"]) == (400, 400, "INVALID_ARGUMENT"), raw
        assert needle in error["message"], (raw, error)
    bare = httpx.post(
        f"{proxy.url}/v1beta/models/{MODEL}:countTokens", params={"key": "pk-nope"}, json={}, timeout=HANG_GUARD_S
    )
    assert bare.status_code == 401 and bare.json()["error"]["status"] == "UNAUTHENTICATED"
    array = httpx.post(
        f"{proxy.url}/v1beta/models/{MODEL}:streamGenerateContent",
        params={"key": key},
        json={"contents": [{"parts": [{"text": "hi"}]}], "toolConfig": {"functionCallingConfig": {"mode": "NONE"}}},
        timeout=HANG_GUARD_S,
    )
    chunks = json.loads(array.text)
    assert isinstance(chunks, list) and chunks[-1]["candidates"][0]["finishReason"] == "STOP"
