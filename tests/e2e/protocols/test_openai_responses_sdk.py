"""OpenAI Responses through the live proxy with the official ``openai`` SDK: tool loops (function and custom
tools, streaming and not, full history each turn as Codex sends it), a Codex-shaped request, the token limit,
count tokens, and bad input. Every captured call is checked token for token against the engine."""

from __future__ import annotations

import itertools
import json
from typing import Any

import httpx
import openai
import pytest

from polar.storage.calls.read import chat_form
from tests.live_proxy import LiveProxy
from tests.processes import HANG_GUARD_S

PATCH = "*** Begin Patch\n*** Add File: hello.txt\n+hello\n*** End Patch"
TURNS = [
    {"reasoning": "I should check the weather first.",
     "tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]},
    {"reasoning": "Now write the file.", "tool_calls": [{"name": "apply_patch", "arguments": {"input": PATCH}}]},
    {"reasoning": "Both done.", "content": "Sunny in Paris; hello.txt written."},
]  # fmt: skip
TOOLS: list[Any] = [
    {"type": "function", "name": "get_weather", "description": "Weather for a city", "strict": False,
     "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
    {"type": "custom", "name": "apply_patch", "description": "Apply a patch to files",
     "format": {"type": "grammar", "syntax": "lark", "definition": "start: /(.|\\n)+/"}},
    {"type": "web_search", "external_web_access": True},
]  # fmt: skip
EXPECTED_TYPES = [["reasoning", "function_call"], ["reasoning", "custom_tool_call"], ["reasoning", "message"]]


def _client(proxy: LiveProxy, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=proxy.base(key) + "/v1", api_key=key, max_retries=0)


def _tool_results(output: list[Any]) -> list[dict[str, Any]]:
    results = []
    for item in output:
        if item.type == "function_call":
            assert json.loads(item.arguments) == {"city": "Paris"} and item.call_id.startswith("chatcmpl-tool-")
            results.append({"type": "function_call_output", "call_id": item.call_id, "output": "sunny, 21C"})
        elif item.type == "custom_tool_call":
            assert item.input == PATCH and item.name == "apply_patch"
            results.append({"type": "custom_tool_call_output", "call_id": item.call_id, "output": "Done!"})
    return results


def _as_codex_history(item: Any) -> dict[str, Any]:
    """Codex keeps output items as history but drops reasoning ``content`` (the summary carries it)."""
    dumped = item.model_dump(exclude_none=True)
    if dumped["type"] == "reasoning":
        dumped.pop("content", None)
    return dumped  # type: ignore[no-any-return]


def _check_calls(proxy: LiveProxy, session_id: Any, count: int, chained: bool = True) -> list[dict[str, Any]]:
    calls = proxy.calls(session_id)
    entries = proxy.engine_entries()
    assert len(calls) == count
    for call in calls:
        logged = proxy.logged(entries, call)
        assert call["provider"] == "openai_responses" and call["model"] == "my-model"
        assert call["completion_token_ids"] == logged["token_ids"]
        assert call["prompt_token_ids"] == logged["prompt_token_ids"]
        assert call["prompt_token_ids"] == proxy.prompt_ids(call["normalized_request"])
    if chained:  # each turn's prompt extends the previous prompt + sampled tokens: history round-trips exactly
        for before, after in itertools.pairwise(calls):
            sequence = before["prompt_token_ids"] + before["completion_token_ids"]
            assert after["prompt_token_ids"][: len(sequence)] == sequence
    return calls


def test_tool_loop(proxy: LiveProxy) -> None:
    session_id, key = proxy.session()
    client = _client(proxy, key)
    history: list[Any] = [{"role": "user", "content": "Weather in Paris, then write hello.txt."}]
    for turn in range(3):
        response = client.responses.create(
            model="my-model", instructions="Be brief.", input=history, tools=TOOLS, store=False,
            reasoning={"effort": "medium", "summary": "auto"}, include=["reasoning.encrypted_content"],
        )  # fmt: skip
        assert [item.type for item in response.output] == EXPECTED_TYPES[turn]
        assert response.status == "completed" and response.model == "my-model" and response.id.startswith("resp_")
        assert response.output[0].summary[0].text == TURNS[turn]["reasoning"]
        assert response.usage is not None and response.usage.total_tokens > response.usage.input_tokens > 0
        history += [item.model_dump(exclude_none=True) for item in response.output] + _tool_results(response.output)
    assert response.output_text == "Sunny in Paris; hello.txt written."
    calls = _check_calls(proxy, session_id, 3)
    assert chat_form(calls[0]["normalized_request"])["messages"][0] == {"role": "system", "content": "Be brief."}
    assert [t["function"]["name"] for t in chat_form(calls[0]["normalized_request"])["tools"]] == [
        "get_weather",
        "apply_patch",
    ]
    assert response.usage.input_tokens == len(calls[2]["prompt_token_ids"])


def test_streamed_tool_loop(proxy: LiveProxy) -> None:
    session_id, key = proxy.session()
    client = _client(proxy, key)
    history: list[Any] = [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You are Codex."}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather, then a file."}]},
    ]
    for turn in range(3):
        with client.responses.stream(model="my-model", input=history, tools=TOOLS, store=False) as stream:
            kinds = [event.type for event in stream]
            response = stream.get_final_response()
        assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
        assert kinds.count("response.output_item.added") == kinds.count("response.output_item.done") == 2
        assert [item.type for item in response.output] == EXPECTED_TYPES[turn]
        history += [_as_codex_history(item) for item in response.output] + _tool_results(response.output)
    assert "response.output_text.delta" in kinds and response.output_text == "Sunny in Paris; hello.txt written."
    _check_calls(proxy, session_id, 3)


def test_codex_shaped_stream(proxy: LiveProxy) -> None:
    session_id, key = proxy.session()
    namespace = {"type": "namespace", "name": "multi_agent_v1", "description": "Sub-agents",
                 "tools": [{"type": "function", "name": "get_weather", "strict": False,
                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]}  # fmt: skip
    body = {
        "model": "my-model", "stream": True, "store": False, "tool_choice": "auto", "parallel_tool_calls": True,
        "reasoning": {"summary": "auto"}, "include": ["reasoning.encrypted_content"], "prompt_cache_key": "t-1",
        "client_metadata": {"x-codex-installation-id": "i"}, "tools": [namespace, {"type": "web_search"}],
        "input": [{"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Rules."}]},
                  {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go"}]}],
    }  # fmt: skip
    # A proxy's first SGLang call loads the model's tokenizer with transformers: seconds on a busy machine, past
    # httpx's default 5 s (the SDKs wait 600 s).
    url, headers = f"{proxy.base(key)}/v1/responses", {"authorization": "Bearer x"}
    with httpx.stream("POST", url, json=body, headers=headers, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        text = "".join(r.iter_text())
    assert "[DONE]" not in text
    blocks = [block.split("\n") for block in text.strip().split("\n\n")]
    events = [json.loads(lines[1].removeprefix("data: ")) for lines in blocks]
    assert all(lines[0] == f"event: {e['type']}" for lines, e in zip(blocks, events, strict=True))
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    summary = next(e for e in events if e["type"] == "response.reasoning_summary_text.delta")
    raw = next(e for e in events if e["type"] == "response.reasoning_text.delta")
    assert summary["summary_index"] == 0 and raw["content_index"] == 0
    call = [e["item"] for e in events if e["type"] == "response.output_item.done"][-1]
    assert call["type"] == "function_call" and call["namespace"] == "multi_agent_v1" and call["name"] == "get_weather"
    completed = events[-1]["response"]
    assert events[-1]["type"] == "response.completed" and completed["id"] == events[0]["response"]["id"]
    assert set(completed["usage"]) >= {"input_tokens", "output_tokens", "total_tokens"}
    _check_calls(proxy, session_id, 1)


def test_token_limit_and_count(proxy: LiveProxy) -> None:
    session_id, key = proxy.session()
    client = _client(proxy, key)
    cut = client.responses.create(model="my-model", input="hi", max_output_tokens=3)
    assert (
        cut.status == "incomplete" and cut.incomplete_details and cut.incomplete_details.reason == "max_output_tokens"
    )
    assert cut.usage is not None and cut.usage.output_tokens == 3
    events = list(client.responses.create(model="my-model", input="hi", max_output_tokens=3, stream=True))
    assert events[0].type == "response.created" and events[-1].type == "response.incomplete"
    counted = client.responses.input_tokens.count(model="my-model", input="hi")
    assert counted.object == "response.input_tokens" and counted.input_tokens == cut.usage.input_tokens
    calls = _check_calls(proxy, session_id, 2, chained=False)
    assert calls[0]["finish_reason"] == "length" and proxy.sampling(calls[0], "max_tokens") == 3


def test_bad_input(proxy: LiveProxy) -> None:
    _, key = proxy.session()
    client = _client(proxy, key)
    bad: list[dict[str, Any]] = [
        {"input": "hi", "previous_response_id": "resp_1"},
        {"input": 123},
        {"input": "hi", "max_output_tokens": "many"},
        {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:x"}]}]},
        {"input": "hi", "tools": [{"type": "file_search", "vector_store_ids": []}]},
    ]
    for params, word in zip(
        bad, ["full history", "input", "max_output_tokens", "input[0].content[0].image_url", "file_search"], strict=True
    ):
        with pytest.raises(openai.BadRequestError) as caught:
            client.responses.create(model="my-model", **params)
        assert word in caught.value.message and caught.value.status_code == 400
    url = f"{proxy.base(key)}/v1/responses"
    for content in (b"{oops", b'{"input": "hi"}', b'{"model": "m"}'):
        raw = httpx.post(url, content=content, headers={"content-type": "application/json"}, timeout=HANG_GUARD_S)
        assert raw.status_code == 400 and raw.json()["error"]["type"] == "invalid_request_error"
    with pytest.raises(openai.AuthenticationError) as unknown:
        _client(proxy, "pk-nope").responses.create(model="my-model", input="hi")
    assert unknown.value.status_code == 401 and "unknown proxy key" in unknown.value.message
