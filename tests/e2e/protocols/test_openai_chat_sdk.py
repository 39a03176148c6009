"""OpenAI Chat Completions through the proxy with the official ``openai`` SDK: a tool loop, streamed and not,
every captured call token-exact against the engine's own log and tokenizer."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from polar.storage.calls.read import chat_form
from tests.live_proxy import LiveProxy
from tests.processes import HANG_GUARD_S

TURNS = {
    "turns": [
        {"reasoning": "I should look it up.", "tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]},
        {"reasoning": "Now answer.", "content": "It is sunny in Paris."},
    ]
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]


def assert_token_exact(proxy: LiveProxy, session_id: object) -> int:
    entries = proxy.engine_entries()
    calls = proxy.calls(session_id)  # type: ignore[arg-type]
    for call in calls:
        logged = proxy.logged(entries, call)
        assert call["completion_token_ids"] == logged["token_ids"]
        assert call["prompt_token_ids"] == logged["prompt_token_ids"]
        assert proxy.prompt_ids(call["normalized_request"]) == call["prompt_token_ids"]
        assert call["engine_kind"] == proxy.engine_kind
    return len(calls)


@pytest.mark.parametrize("stream", [False, True])
def test_tool_loop(proxy: LiveProxy, stream: bool) -> None:
    session_id, key = proxy.session()
    client = openai.OpenAI(base_url=f"{proxy.base(key)}/v1", api_key=key, max_retries=0)
    messages: list = [{"role": "user", "content": "Weather in Paris?"}]
    if stream:
        with client.chat.completions.stream(model="gpt-test", messages=messages, tools=TOOLS) as events:
            for _ in events:
                pass
            first = events.get_final_completion()
    else:
        first = client.chat.completions.create(model="gpt-test", messages=messages, tools=TOOLS)
    assert first.model == "gpt-test" and first.choices[0].finish_reason == "tool_calls"
    call = first.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    messages.append(first.choices[0].message.model_dump(exclude_none=True, exclude={"parsed", "refusal"}))
    messages.append({"role": "tool", "tool_call_id": call.id, "content": "sunny"})
    second = client.chat.completions.create(model="gpt-test", messages=messages, tools=TOOLS, stream=stream)
    if stream:
        text = "".join(c.choices[0].delta.content or "" for c in second if c.choices)
    else:
        text = second.choices[0].message.content
    assert "sunny in Paris" in text
    calls = proxy.calls(session_id)
    assert [c["stream"] for c in calls] == [stream, stream]
    assert chat_form(calls[1]["normalized_request"])["messages"][2]["tool_call_id"] == call.id
    assert assert_token_exact(proxy, session_id) == 2


def test_bad_input_gets_openai_errors(proxy: LiveProxy) -> None:
    _session_id, key = proxy.session()
    client = openai.OpenAI(base_url=f"{proxy.base(key)}/v1", api_key=key, max_retries=0)
    with pytest.raises(openai.BadRequestError, match="model"):
        client.chat.completions.create(model="", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.BadRequestError, match=r"messages\[0\]\.content\[0\]\.image_url\.url: a data URL"):
        client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:"}}]}]
        )
    raw = httpx.post(
        f"{proxy.base(key)}/v1/chat/completions",
        content=b"[1,",
        headers={"content-type": "application/json"},
        timeout=HANG_GUARD_S,
    )
    assert raw.status_code == 400 and raw.json()["error"]["type"] == "invalid_request_error"
    wrong = httpx.post(
        f"{proxy.base(key)}/v1/chat/completions", json={"model": "m", "messages": [{"role": 1}]}, timeout=HANG_GUARD_S
    )
    assert wrong.status_code == 400 and "role" in wrong.json()["error"]["message"]
    big = httpx.post(f"{proxy.base(key)}/v1/chat/completions", content=b"x" * (33 * 1024 * 1024), timeout=HANG_GUARD_S)
    assert big.status_code == 413 and "error" in big.json()
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{proxy.url}/s/pk-unknown/v1", api_key="x", max_retries=0).models.list()
