"""``polar.protocols.anthropic`` (and its stream sibling) on recorded payloads: a Claude Code request with
billing line, thinking, tool use and tool results; vLLM answers rendered as messages and as event streams;
errors, models and count-tokens bodies; bad input."""

from __future__ import annotations

import copy
import json
from typing import Any

import anthropic as sdk
import httpx2
import pytest

from polar.errors import ValidationError
from polar.protocols import PROTOCOLS, anthropic, detect
from polar.protocols._base import EngineAnswer

TOOL_ID = "chatcmpl-tool-8f2a1c"
READ_TOOL = {
    "name": "Read",
    "description": "Read a file",
    "input_schema": {"type": "object", "properties": {"file_path": {"type": "string"}}, "required": ["file_path"]},
    "cache_control": {"type": "ephemeral"},
}
# What Claude Code 2.1 sends on its second turn (trimmed): billing line first, then its system prompt.
CLAUDE_CODE_REQUEST: dict[str, Any] = {
    "model": "claude-sonnet-4-5",
    "max_tokens": 64000,
    "stream": True,
    "system": [
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.77.a1b; cc_entrypoint=cli; cch=9f3e1;"},
        {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "Be brief."},
    ],
    "messages": [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "<system-reminder>ctx</system-reminder>"},
                {"type": "text", "text": "read a"},
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "I will read it.", "signature": "sig"},
                {"type": "redacted_thinking", "data": "opaque"},
                {"type": "tool_use", "id": TOOL_ID, "name": "Read", "input": {"file_path": "a"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": TOOL_ID, "content": [{"type": "text", "text": "hello"}]},
                {"type": "text", "text": "and now?", "cache_control": {"type": "ephemeral"}},
            ],
        },
    ],
    "tools": [READ_TOOL],
    "tool_choice": {"type": "auto"},
    "thinking": {"type": "enabled", "budget_tokens": 31999},
    "metadata": {"user_id": "user_abc"},
    "context_management": {"edits": []},
    "output_config": {"effort": "high"},
    "temperature": 1,
}


def answer(message: dict[str, Any], finish: str = "stop", stop_reason: Any = None, cached: int = 0) -> EngineAnswer:
    """A vLLM chat completion as the proxy receives it (capture fields on)."""
    usage: dict[str, Any] = {"prompt_tokens": 30, "completion_tokens": 7, "total_tokens": 37}
    if cached:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    return EngineAnswer({
        "id": "chatcmpl-abc123", "object": "chat.completion", "created": 1, "model": "polar-reference",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": None, "reasoning": None, **message},
                     "logprobs": None, "finish_reason": finish, "stop_reason": stop_reason,
                     "token_ids": [1, 2, 3, 4, 5, 6, 7]}],
        "usage": usage, "prompt_token_ids": list(range(30)),
    })  # fmt: skip


TOOL_ANSWER = answer(
    {"content": "\n\n", "reasoning": "\nLook at b.\n",
     "tool_calls": [{"id": "chatcmpl-tool-77", "type": "function",
                     "function": {"name": "Read", "arguments": '{"file_path": "b"}'}}]},
    finish="tool_calls",
)  # fmt: skip


def request(**overrides: Any) -> Any:
    body = {"model": "claude-x", "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}], **overrides}
    return anthropic.normalize(body)


def events(stream: bytes) -> list[tuple[str, dict[str, Any]]]:
    parsed = []
    for chunk in stream.decode().split("\n\n")[:-1]:
        event_line, data_line = chunk.split("\n")
        assert event_line.startswith("event: ") and data_line.startswith("data: ")
        data = json.loads(data_line[6:])
        assert data["type"] == event_line[7:]
        parsed.append((event_line[7:], data))
    return parsed


def test_claude_code_request_normalises() -> None:
    normalized = anthropic.normalize(copy.deepcopy(CLAUDE_CODE_REQUEST))
    assert normalized.provider == "anthropic" and normalized.stream and normalized.model == "claude-sonnet-4-5"
    assert normalized.engine_body == {
        "messages": [
            {"role": "system", "content": "You are Claude Code.\nBe brief."},
            {"role": "user", "content": "<system-reminder>ctx</system-reminder>\nread a"},
            {"role": "assistant", "content": "", "reasoning": "I will read it.",
             "tool_calls": [{"id": TOOL_ID, "type": "function",
                             "function": {"name": "Read", "arguments": '{"file_path": "a"}'}}]},
            {"role": "tool", "tool_call_id": TOOL_ID, "content": "hello"},
            {"role": "user", "content": "and now?"},
        ],
        "tools": [{"type": "function", "function": {"name": "Read", "description": "Read a file",
                                                    "parameters": READ_TOOL["input_schema"]}}],
        "tool_choice": "auto",
        "chat_template_kwargs": {"enable_thinking": True},
        "max_tokens": 32768,
        "temperature": 1,
    }  # fmt: skip


def test_billing_line_is_stripped_in_every_form() -> None:
    """The line changes every call (``cch=``), so two calls must normalise to the same prompt."""
    first, second = copy.deepcopy(CLAUDE_CODE_REQUEST), copy.deepcopy(CLAUDE_CODE_REQUEST)
    second["system"][0]["text"] = "x-anthropic-billing-header: cc_version=2.1.78.ffe; cc_entrypoint=cli; cch=0042a;"
    assert anthropic.normalize(first).engine_body == anthropic.normalize(second).engine_body
    as_string = "x-anthropic-billing-header: cc_version=1; cch=2;\nYou are Claude Code."
    assert request(system=as_string).engine_body["messages"][0] == {"role": "system", "content": "You are Claude Code."}
    only_billing = [{"type": "text", "text": "x-anthropic-billing-header: cch=1;"}]
    assert request(system=only_billing).engine_body["messages"][0]["role"] == "user"
    kept = "Mention x-anthropic-billing-header: mid-line is kept."
    assert request(system=kept).engine_body["messages"][0]["content"] == kept


def test_tool_results_text_order_errors_and_choices() -> None:
    content = [
        {"type": "text", "text": "before"},
        {"type": "tool_result", "tool_use_id": "t1", "content": "ok"},
        {"type": "tool_result", "tool_use_id": "t2", "content": "boom", "is_error": True},
        {"type": "tool_result", "tool_use_id": "t3", "is_error": True},
        {"type": "text", "text": "after"},
        {"type": "text", "text": "more"},
    ]
    body = request(messages=[{"role": "user", "content": content}], tools=[READ_TOOL], tool_choice={"type": "any"})
    assert body.engine_body["messages"] == [
        {"role": "user", "content": "before"},
        {"role": "tool", "tool_call_id": "t1", "content": "ok"},
        {"role": "tool", "tool_call_id": "t2", "content": "Error: boom"},
        {"role": "tool", "tool_call_id": "t3", "content": "Error"},
        {"role": "user", "content": "after\nmore"},
    ]
    assert body.engine_body["tool_choice"] == "required"
    named = request(tools=[READ_TOOL], tool_choice={"type": "tool", "name": "Read", "disable_parallel_tool_use": True})
    assert named.engine_body["tool_choice"] == {"type": "function", "function": {"name": "Read"}}
    assert named.engine_body["parallel_tool_calls"] is False
    assert request(tools=[READ_TOOL], tool_choice={"type": "none"}).engine_body["tool_choice"] == "none"
    assert "tool_choice" not in request(tool_choice={"type": "auto"}).engine_body  # no tools: nothing to choose


def test_prefill_sampling_and_thinking_switches() -> None:
    prefill = request(
        messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Paris is"}],
        stop_sequences=["END"], temperature=0.2, top_p=0.9, top_k=5, max_tokens=7, thinking={"type": "disabled"},
    )  # fmt: skip
    body = prefill.engine_body
    assert body["messages"][-1] == {"role": "assistant", "content": "Paris is"}
    assert body["continue_final_message"] is True and body["add_generation_prompt"] is False
    assert (body["stop"], body["temperature"], body["top_p"], body["top_k"], body["max_tokens"]) == (
        ["END"], 0.2, 0.9, 5, 7,
    )  # fmt: skip
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    assert prefill.options["stop"] == ["END"] and not prefill.stream
    plain = request(thinking={"type": "adaptive", "display": "summarized"}).engine_body
    assert "chat_template_kwargs" not in request(thinking={"type": "between_tools"}).engine_body
    assert "chat_template_kwargs" not in plain and "continue_final_message" not in plain and "stop" not in plain


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"max_tokens": None}, "max_tokens"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": True}, "max_tokens"),
        ({"model": ""}, "model"),
        ({"messages": "hi"}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": ["hi"]}, "messages[0]"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": [{"text": "no type"}]}]}, "messages[0].content[0]"),
        ({"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "b"}]}]},
         "messages[0].content[0]"),
        ({"messages": [{"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "a"}]}]},
         "messages[0].content[0]"),
        ({"messages": [{"role": "user", "content": [{"type": "tool_result"}]}]}, "messages[0].content[0]"),
        ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a",
                                                     "content": [{"type": "search_result"}]}]}]},
         "messages[0].content[0].content[0]"),
        ({"system": 3}, "system"),
        ({"system": [{"type": "image"}]}, "system[0]"),
        ({"stop_sequences": "END"}, "stop_sequences"),
        ({"temperature": "hot"}, "temperature"),
        ({"stream": "yes"}, "stream"),
        ({"tools": {"name": "x"}}, "tools"),
        ({"tools": [{"name": "x"}]}, "tools[0]"),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0]"),
        ({"tools": [READ_TOOL], "tool_choice": {"type": "sometimes"}}, "tool_choice"),
        ({"tools": [READ_TOOL], "tool_choice": {"type": "tool"}}, "tool_choice.name"),
        ({"thinking": "on"}, "thinking"),
        ({"thinking": {"budget_tokens": 5}}, "thinking"),
    ],
)  # fmt: skip
def test_bad_input_names_the_field(overrides: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as caught:
        request(**overrides)
    assert caught.value.field == field and str(caught.value).startswith(field)


def test_documents_and_undecodable_images_are_refused() -> None:
    """Images are read (tests/polar/protocols/test_images.py); bytes that are no image, and documents, are not."""
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}
    document = {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "x"}}
    for content in ([image], [{"type": "tool_result", "tool_use_id": "t", "content": [image]}]):
        with pytest.raises(ValidationError, match="not a PNG, JPEG, GIF or WEBP image"):
            request(messages=[{"role": "user", "content": content}])
    with pytest.raises(ValidationError, match="document input is not supported by this model"):
        request(messages=[{"role": "user", "content": [document]}])
    with pytest.raises(ValidationError, match="JSON object"):
        anthropic.normalize([1, 2])


def test_tool_ids_round_trip_when_the_engine_mints_odd_ones() -> None:
    assert anthropic.client_tool_id(TOOL_ID) == TOOL_ID == anthropic.engine_tool_id(TOOL_ID)
    for odd in ("functions.get_weather:0", "polarb64_looks_encoded", "ünï", "id\n"):
        client = anthropic.client_tool_id(odd)
        assert anthropic.TOOL_ID.fullmatch(client) and anthropic.engine_tool_id(client) == odd
    assert anthropic.engine_tool_id("polarb64_!!") == "polarb64_!!"  # not ours: unchanged
    kimi = answer({"tool_calls": [{"id": "functions.Read:0", "type": "function",
                                   "function": {"name": "Read", "arguments": "{}"}}]}, finish="tool_calls")  # fmt: skip
    client_id = anthropic.render_response(request(), kimi)["content"][0]["id"]
    back = request(messages=[
        {"role": "assistant", "content": [{"type": "tool_use", "id": client_id, "name": "Read", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": client_id, "content": "x"}]},
    ]).engine_body["messages"]  # fmt: skip
    assert back[0]["tool_calls"][0]["id"] == back[1]["tool_call_id"] == "functions.Read:0"


def test_render_tool_call_answer() -> None:
    rendered = anthropic.render_response(request(model="claude-x"), TOOL_ANSWER)
    thinking = {"type": "thinking", "thinking": "Look at b.", "signature": anthropic.signature("Look at b.")}
    assert rendered == {
        "id": "msg_abc123", "type": "message", "role": "assistant", "model": "claude-x",
        "content": [thinking, {"type": "tool_use", "id": "chatcmpl-tool-77", "name": "Read",
                               "input": {"file_path": "b"}}],
        "stop_reason": "tool_use", "stop_sequence": None,
        "usage": {"input_tokens": 30, "output_tokens": 7, "cache_creation_input_tokens": 0,
                  "cache_read_input_tokens": 0},
    }  # fmt: skip
    assert anthropic.signature("Look at b.") == anthropic.signature("Look at b.") != anthropic.signature("other")


def test_rendered_turn_normalises_back_to_what_the_engine_said() -> None:
    """Sending an answer back as history gives the engine its own message again (prefix matching holds)."""
    content = anthropic.render_response(request(), TOOL_ANSWER)["content"]
    history = request(messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": content},
                                {"role": "user", "content": "go on"}]).engine_body["messages"]  # fmt: skip
    engine_message = TOOL_ANSWER.message  # reasoning without its newlines: the template strips them anyway
    assert history[1] == {"role": "assistant", "content": "", "reasoning": engine_message["reasoning"].strip(),
                          "tool_calls": engine_message["tool_calls"]}  # fmt: skip


@pytest.mark.parametrize(
    ("finish", "matched", "stops", "expected"),
    [
        ("stop", None, [], ("end_turn", None)),
        ("stop", "END", ["END"], ("stop_sequence", "END")),
        ("stop", "END", [], ("end_turn", None)),
        ("stop", 151645, ["END"], ("end_turn", None)),
        ("length", None, [], ("max_tokens", None)),
        ("content_filter", None, [], ("refusal", None)),
    ],
)
def test_stop_reasons(finish: str, matched: Any, stops: list[str], expected: tuple[str, str | None]) -> None:
    rendered = anthropic.render_response(
        request(stop_sequences=stops), answer({"content": "Hi"}, finish=finish, stop_reason=matched)
    )
    assert (rendered["stop_reason"], rendered["stop_sequence"]) == expected


def test_text_answers_usage_and_odd_arguments() -> None:
    thought = answer({"content": "\n\nParis is sunny.", "reasoning": "Think."}, cached=10)
    rendered = anthropic.render_response(request(), thought)
    assert [b["type"] for b in rendered["content"]] == ["thinking", "text"]
    assert rendered["content"][1]["text"] == "Paris is sunny."
    assert rendered["usage"] == {"input_tokens": 20, "output_tokens": 7, "cache_creation_input_tokens": 0,
                                 "cache_read_input_tokens": 10}  # fmt: skip
    assert anthropic.render_response(request(), answer({"content": "  \n"}))["content"] == []
    broken = answer({"tool_calls": [{"id": "t", "function": {"name": "f", "arguments": "{oops"}}]}, "tool_calls")
    assert anthropic.render_response(request(), broken)["content"][0]["input"] == "{oops"
    again = request(
        messages=[{"role": "assistant", "content": anthropic.render_response(request(), broken)["content"]}]
    )
    assert again.engine_body["messages"][0]["tool_calls"][0]["function"]["arguments"] == "{oops"


def test_stream_event_order_and_payloads() -> None:
    stream = b"".join(anthropic.render_stream(request(model="claude-x", stream=True), TOOL_ANSWER))
    parsed = events(stream)
    assert [kind for kind, _ in parsed] == [
        "message_start", "ping",
        "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_stop",
        "message_delta", "message_stop",
    ]  # fmt: skip
    start = parsed[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["model"] == "claude-x"
    assert start["usage"]["input_tokens"] == 30 and start["usage"]["output_tokens"] == 1
    assert parsed[2][1] == {"type": "content_block_start", "index": 0,
                            "content_block": {"type": "thinking", "thinking": "", "signature": ""}}  # fmt: skip
    assert parsed[3][1]["delta"] == {"type": "thinking_delta", "thinking": "Look at b."}
    assert parsed[4][1]["delta"] == {"type": "signature_delta", "signature": anthropic.signature("Look at b.")}
    assert parsed[6][1]["content_block"] == {"type": "tool_use", "id": "chatcmpl-tool-77", "name": "Read", "input": {}}
    assert parsed[7][1] == {"type": "content_block_delta", "index": 1,
                            "delta": {"type": "input_json_delta", "partial_json": '{"file_path": "b"}'}}  # fmt: skip
    assert parsed[9][1]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert parsed[9][1]["usage"]["output_tokens"] == 7


def test_stream_of_text_with_stop_sequence() -> None:
    text = answer({"content": "Sunny "}, stop_reason="END")
    parsed = events(b"".join(anthropic.render_stream(request(stop_sequences=["END"]), text)))
    assert [kind for kind, _ in parsed][2:5] == ["content_block_start", "content_block_delta", "content_block_stop"]
    assert parsed[3][1]["delta"] == {"type": "text_delta", "text": "Sunny "}
    assert parsed[-2][1]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "END"}
    empty_args = answer({"tool_calls": [{"id": "t", "function": {"name": "f", "arguments": ""}}]}, "tool_calls")
    deltas = [d for k, d in events(b"".join(anthropic.render_stream(request(), empty_args))) if k.endswith("delta")]
    assert deltas[0]["delta"]["partial_json"] == "{}"


@pytest.mark.parametrize(
    ("status", "kind"),
    [(400, "invalid_request_error"), (401, "authentication_error"), (403, "permission_error"),
     (404, "not_found_error"), (409, "invalid_request_error"), (413, "request_too_large"),
     (429, "rate_limit_error"), (500, "api_error"), (502, "api_error"), (503, "overloaded_error"),
     (504, "timeout_error"), (529, "overloaded_error"), (599, "api_error")],
)  # fmt: skip
def test_error_shapes(status: int, kind: str) -> None:
    body = anthropic.render_error(status, "nope")
    assert body["type"] == "error" and body["error"] == {"type": kind, "message": "nope"}
    assert body["request_id"].startswith("req_")
    assert events(anthropic.render_stream_error(status, "nope")) == [
        ("error", {"type": "error", "error": {"type": kind, "message": "nope"}})
    ]


def test_models_count_tokens_and_detection() -> None:
    assert anthropic.render_models(["a", "b"]) == {
        "data": [{"type": "model", "id": m, "display_name": m, "created_at": "1970-01-01T00:00:00Z"} for m in "ab"],
        "has_more": False, "first_id": "a", "last_id": "b",
    }  # fmt: skip
    assert anthropic.render_models([])["first_id"] is None
    counted = copy.deepcopy(CLAUDE_CODE_REQUEST)
    del counted["max_tokens"], counted["stream"]
    tokenize = anthropic.count_tokens_request(counted)
    full = anthropic.normalize(copy.deepcopy(CLAUDE_CODE_REQUEST)).engine_body
    assert tokenize == {"add_generation_prompt": True, "messages": full["messages"], "tools": full["tools"],
                        "chat_template_kwargs": {"enable_thinking": True}}  # fmt: skip
    prefill = {"model": "m", "messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}
    assert anthropic.count_tokens_request(prefill) == {
        "add_generation_prompt": False, "continue_final_message": True,
        "messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}],
    }  # fmt: skip
    assert anthropic.render_count_tokens(12) == {"input_tokens": 12}
    assert PROTOCOLS["anthropic"] is anthropic
    headers = {"anthropic-version": "2023-06-01"}
    assert detect("GET", "/v1/models", headers, {}).protocol is anthropic  # type: ignore[union-attr]
    assert detect("GET", "/v1/models", {}, {}).protocol is not anthropic  # type: ignore[union-attr]
    assert detect("POST", "/v1/messages", {}, {"beta": "true"}).operation == "generate"  # type: ignore[union-attr]
    assert detect("POST", "/v1/messages/count_tokens", {}, {}).operation == "count_tokens"  # type: ignore[union-attr]
    assert detect("HEAD", "/", {}, {}).operation == "head"  # type: ignore[union-attr]


def _sdk_over(body: bytes, status: int = 200, stream: bool = True) -> sdk.Anthropic:
    """The official SDK reading ``body`` as the server's answer (its own transport, no network)."""
    kind = "text/event-stream" if stream else "application/json"
    transport = httpx2.MockTransport(lambda _: httpx2.Response(status, content=body, headers={"content-type": kind}))
    return sdk.Anthropic(
        api_key="k", base_url="http://proxy", max_retries=0, http_client=httpx2.Client(transport=transport)
    )


def test_the_sdk_parses_our_streams_and_errors() -> None:
    hi: Any = [{"role": "user", "content": "hi"}]
    rendered = anthropic.render_response(request(model="claude-x"), TOOL_ANSWER)
    stream = b"".join(anthropic.render_stream(request(model="claude-x", stream=True), TOOL_ANSWER))
    with _sdk_over(stream).messages.stream(model="claude-x", max_tokens=5, messages=hi) as events:
        final = events.get_final_message()
    expected = {key: value for key, value in rendered.items() if value is not None}
    assert final.model_dump(include=set(rendered), exclude_none=True) == expected  # as if not streamed

    head = stream.split(b"event: content_block_start")[0]
    with pytest.raises(sdk.APIStatusError, match="engine overloaded") as caught:  # noqa: SIM117
        with _sdk_over(head + anthropic.render_stream_error(503, "engine overloaded")).messages.stream(
            model="m", max_tokens=5, messages=hi
        ) as events:
            events.get_final_message()
    assert caught.value.body == {"type": "error", "error": {"type": "overloaded_error", "message": "engine overloaded"}}

    errors = ((400, sdk.BadRequestError), (401, sdk.AuthenticationError), (403, sdk.PermissionDeniedError),
              (404, sdk.NotFoundError), (413, sdk.RequestTooLargeError), (429, sdk.RateLimitError),
              (502, sdk.InternalServerError), (529, sdk.OverloadedError))  # fmt: skip
    for status, error in errors:
        client = _sdk_over(json.dumps(anthropic.render_error(status, "no")).encode(), status, stream=False)
        with pytest.raises(error) as raised:
            client.messages.create(model="m", max_tokens=5, messages=hi)
        assert raised.value.status_code == status and raised.value.body["error"]["message"] == "no"  # type: ignore[index]


def test_system_messages_between_turns_are_kept_in_place() -> None:
    """Claude Code 2.1.19x sends agent/skill listings as role "system" entries inside ``messages``."""
    body = {
        "model": "m",
        "max_tokens": 10,
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "system", "content": [{"type": "text", "text": "Available agents: none."}]},
            {"role": "user", "content": "go"},
        ],
    }
    messages = anthropic.normalize(body).engine_body["messages"]
    assert [m["role"] for m in messages] == ["user", "system", "user"]
    assert messages[1]["content"] == "Available agents: none."
