"""``over_budget: stop`` through the live proxy with the official SDKs: a call over the session's ``max_calls`` gets
a final, well-formed stop reply in the caller's own protocol (an assistant turn without tool calls that ends with
``stop`` / ``end_turn`` / ``completed`` / ``STOP``), streamed and not, so an agent loop ends and its verifier still
grades. The engine is not asked; the reply is recorded as synthesized and kept out of the session's trajectories.
The default, ``refuse``, still answers 429."""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import openai
import pytest
from google import genai
from google.genai import types

from polar.proxy.budget import STOP_TEXT
from polar.stages.postrun import captured_calls
from tests.conftest import redis_database
from tests.live_proxy import LiveProxy, live_proxy
from tests.stacks import engine_entries

USER = [{"role": "user", "content": "Hi"}]
TOOLS = [{"type": "function", "function": {"name": "look", "parameters": {"type": "object", "properties": {}}}}]


@pytest.fixture(scope="module")
def proxy(module_database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveProxy]:
    # Redis shares the call counts among the proxy's workers (without it each counts on its own).
    with redis_database() as redis_url:
        env = {"POLAR_REDIS_URL": redis_url}
        with live_proxy(module_database_url, tmp_path_factory.mktemp("over-budget"), env=env) as live:
            yield live


def _openai(proxy: LiveProxy, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{proxy.base(key)}/v1", api_key=key, max_retries=0)


def test_each_protocol_gets_a_final_stop_over_budget(proxy: LiveProxy) -> None:
    session_id, key = proxy.session(max_calls=1, over_budget="stop")
    chat = _openai(proxy, key)
    first = chat.chat.completions.create(model="m", messages=USER, tools=TOOLS)  # the one call the budget allows
    assert first.choices[0].message.content != STOP_TEXT
    engine_calls = len(engine_entries(proxy.engine_log))

    answer = chat.chat.completions.create(model="m", messages=USER, tools=TOOLS)
    assert answer.choices[0].finish_reason == "stop" and answer.choices[0].message.tool_calls is None
    assert answer.choices[0].message.content == STOP_TEXT
    chunks = list(chat.chat.completions.create(model="m", messages=USER, tools=TOOLS, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == STOP_TEXT
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]

    response = chat.responses.create(model="m", input="Hi")
    assert response.status == "completed" and response.output_text == STOP_TEXT
    assert all(item.type == "message" for item in response.output)
    with chat.responses.stream(model="m", input="Hi") as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert events[-1].type == "response.completed" and final.output_text == STOP_TEXT

    claude = anthropic.Anthropic(base_url=proxy.base(key), api_key=key, max_retries=0)
    message = claude.messages.create(model="m", max_tokens=64, messages=USER)
    assert message.stop_reason == "end_turn" and [b.type for b in message.content] == ["text"]
    assert message.content[0].text == STOP_TEXT
    with claude.messages.stream(model="m", max_tokens=64, messages=USER) as stream:
        streamed = stream.get_final_message()
    assert streamed.stop_reason == "end_turn" and streamed.content[0].text == STOP_TEXT

    gemini = genai.Client(api_key=key, http_options=types.HttpOptions(base_url=proxy.base(key), api_version="v1beta"))
    reply = gemini.models.generate_content(model="m", contents="Hi")
    assert reply.candidates[0].finish_reason == types.FinishReason.STOP and reply.text == STOP_TEXT
    pieces = list(gemini.models.generate_content_stream(model="m", contents="Hi"))
    assert "".join(p.text or "" for p in pieces) == STOP_TEXT
    assert pieces[-1].candidates[0].finish_reason == types.FinishReason.STOP

    assert len(engine_entries(proxy.engine_log)) == engine_calls  # the engine was never asked
    calls = proxy.calls(session_id)
    assert [(c["status_code"], c["synthesized"]) for c in calls] == [(200, False)] + [(200, True)] * 8
    assert all(c["completion_token_ids"] == [] and c["sampling"]["used"] is None for c in calls[1:])
    # Only the model's own call is in the trajectories postrun builds; the stop replies are Polar's.
    assert [c.call_id for c in captured_calls(proxy.services, session_id)] == [calls[0]["call_id"]]


def test_refuse_is_the_default(proxy: LiveProxy) -> None:
    session_id, key = proxy.session(max_calls=1)
    chat = _openai(proxy, key)
    chat.chat.completions.create(model="m", messages=USER)
    with pytest.raises(openai.RateLimitError):
        chat.chat.completions.create(model="m", messages=USER)
    assert len(proxy.calls(session_id)) == 1


def test_sampling_is_recorded_and_neutralized_on_request(proxy: LiveProxy) -> None:
    """What each protocol's request normalises to is what is recorded as requested (OpenAI's chat API has no top_k;
    Anthropic's has)."""
    asked = {"temperature": 0.3, "top_p": 0.8, "seed": 7, "max_tokens": 50, "presence_penalty": 0.5}
    for mode in ("record", "neutralize"):
        session_id, key = proxy.session(sampling=mode)
        _openai(proxy, key).chat.completions.create(model="m", messages=USER, **asked)
        claude = anthropic.Anthropic(base_url=proxy.base(key), api_key=key, max_retries=0)
        claude.messages.create(model="m", max_tokens=40, messages=USER, extra_body={"temperature": 0.5, "top_k": 5})
        chat_call, claude_call = proxy.calls(session_id)
        assert chat_call["sampling"]["requested"] == asked and chat_call["sampling"]["mode"] == mode
        assert claude_call["sampling"]["requested"] == {"temperature": 0.5, "top_k": 5, "max_tokens": 40}
        for call in (chat_call, claude_call):
            sent = {k: v for k, v in call["normalized_request"].items() if k in call["sampling"]["requested"]}
            sent.update({k: call["normalized_request"][k] for k in ("temperature", "top_p")
                         if k in call["normalized_request"]})  # fmt: skip
            assert call["sampling"]["used"] == sent
            if mode == "record":
                assert sent == call["sampling"]["requested"]
        if mode == "neutralize":
            assert chat_call["sampling"]["used"] == {"temperature": 1.0, "top_p": 1.0, "seed": 7, "max_tokens": 50}
            assert claude_call["sampling"]["used"] == {"temperature": 1.0, "top_p": 1.0, "max_tokens": 40}


def test_bad_settings_are_refused_at_submit(proxy: LiveProxy) -> None:
    from polar.contract.task_request import parse_batch_request
    from polar.errors import ValidationError

    for field, value in (("over_budget", "ignore"), ("sampling", "greedy")):
        with pytest.raises(ValidationError) as bad:
            parse_batch_request({"tasks": [{"task_id": "t", "instruction": "i", "harness": {"name": "command",
                                 "command": "true"}, field: value}]})  # fmt: skip
        assert f"tasks[0].{field}" in str(bad.value)
