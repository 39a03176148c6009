"""``polar.protocols.openai_responses`` on recorded payloads: a Codex 0.169 request (trimmed), history items of
every kind, engine answers in vLLM's shape; rendered bodies and events are validated with the SDK's own models."""

from __future__ import annotations

import json
from typing import Any

import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from polar.errors import ValidationError
from polar.protocols import detect, openai_responses
from polar.protocols._base import EngineAnswer

# What `codex exec` 0.169.0 posted to <base>/responses (texts and most tools trimmed).
CODEX_REQUEST: dict[str, Any] = {
    "model": "my-model", "stream": True, "store": False, "tool_choice": "auto", "parallel_tool_calls": True,
    "reasoning": {"summary": "auto"}, "include": ["reasoning.encrypted_content"], "prompt_cache_key": "01a1fcb1",
    "client_metadata": {"x-codex-installation-id": "f5abf7df", "turn_id": "01a1fcb1"},
    "tools": [
        {"type": "function", "name": "exec_command", "description": "Runs a command in a PTY", "strict": False,
         "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"],
                        "additionalProperties": False}},
        {"type": "namespace", "name": "multi_agent_v1", "description": "Tools for spawning and managing sub-agents.",
         "tools": [{"type": "function", "name": "close_agent", "description": "Close an agent", "strict": False,
                    "parameters": {"type": "object", "properties": {"target": {"type": "string"}}}}]},
        {"type": "web_search", "external_web_access": True},
    ],
    "input": [
        {"type": "message", "id": "msg_1c6c", "role": "developer",
         "content": [{"type": "input_text", "text": "You are a coding agent running in the Codex CLI."}]},
        {"type": "message", "id": "msg_01a1", "role": "developer",
         "content": [{"type": "input_text", "text": "<skills_instructions>none</skills_instructions>"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "<environment_context/>"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "say done"}]},
    ],
}  # fmt: skip
PATCH = "*** Begin Patch\n*** Add File: a.txt\n+hi\n*** End Patch"
CUSTOM_TOOL = {"type": "custom", "name": "apply_patch", "description": "Edit files",
               "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}}  # fmt: skip


def _answer(message: dict[str, Any], finish: str = "stop", **usage: Any) -> EngineAnswer:
    return EngineAnswer(
        {
            "id": "chatcmpl-9f3a", "object": "chat.completion", "created": 1700000000, "model": "polar-reference",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": None, **message}, "logprobs": None,
                         "finish_reason": finish, "stop_reason": None, "token_ids": [11, 12, 13]}],
            "usage": {"prompt_tokens": 20, "completion_tokens": 3, "total_tokens": 23, **usage},
            "prompt_token_ids": list(range(20)),
        }
    )  # fmt: skip


def _call(call_id: str, name: str, arguments: Any) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def _events(chunks: list[bytes]) -> list[dict[str, Any]]:
    adapter: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
    events = []
    for chunk in chunks:
        name, data = chunk.decode().removesuffix("\n\n").split("\n")
        event = json.loads(data.removeprefix("data: "))
        assert name == f"event: {event['type']}"
        adapter.validate_python(event)
        events.append(event)
    return events


def test_routes_and_detection() -> None:
    for path, operation in (("/v1/responses", "generate"), ("/responses", "generate"),
                            ("/v1/responses/input_tokens", "count_tokens")):  # fmt: skip
        found = detect("POST", path, {}, {})
        assert found is not None and found.protocol is openai_responses and found.operation == operation
    by_body = detect("POST", "/somewhere", {}, {}, {"model": "m", "input": "hi"})
    assert by_body is not None and by_body.protocol is openai_responses


def test_normalize_codex_request() -> None:
    request = openai_responses.normalize(CODEX_REQUEST)
    assert request.stream and request.model == "my-model" and request.provider == "openai_responses"
    body = request.engine_body
    assert body["messages"] == [
        {"role": "system", "content": "You are a coding agent running in the Codex CLI.\n\n"
                                      "<skills_instructions>none</skills_instructions>"},
        {"role": "user", "content": "<environment_context/>"},
        {"role": "user", "content": "say done"},
    ]  # fmt: skip
    assert [tool["function"]["name"] for tool in body["tools"]] == ["exec_command", "close_agent"]
    assert body["tools"][0]["function"]["parameters"]["required"] == ["cmd"]
    assert body["tool_choice"] == "auto" and body["parallel_tool_calls"] is True
    assert set(body) == {"messages", "tools", "tool_choice", "parallel_tool_calls"}
    assert request.options["tools"]["close_agent"] == {"kind": "function", "name": "close_agent",
                                                        "namespace": "multi_agent_v1"}  # fmt: skip


def test_normalize_sampling_fields() -> None:
    body = openai_responses.normalize(
        {"model": "m", "input": "hi", "instructions": "Be brief.", "max_output_tokens": 100000, "temperature": 0.2,
         "top_p": 0.9, "reasoning": {"effort": "none"}, "metadata": {"a": "b"}, "truncation": "auto",
         "text": {"format": {"type": "json_schema", "name": "out", "schema": {"type": "object"}, "strict": True}}}
    ).engine_body  # fmt: skip
    assert body == {
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
        "max_tokens": 32768, "temperature": 0.2, "top_p": 0.9, "chat_template_kwargs": {"enable_thinking": False},
        "response_format": {"type": "json_schema", "json_schema": {"name": "out", "schema": {"type": "object"},
                                                                   "strict": True}},
    }  # fmt: skip
    thinking = openai_responses.normalize({"model": "m", "input": "hi", "reasoning": {"effort": "high"}})
    assert "chat_template_kwargs" not in thinking.engine_body


def test_normalize_history_items() -> None:
    history = [
        {"role": "user", "content": "weather and a file"},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Check both."}],
         "content": [{"type": "reasoning_text", "text": "Check both, in parallel."}], "encrypted_content": None},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "On it.",
                                                              "annotations": []}]},
        {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_weather",
         "arguments": "{\"city\": \"Paris\"}"},
        {"type": "custom_tool_call", "call_id": "call_2", "name": "apply_patch", "input": PATCH},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        {"type": "custom_tool_call_output", "call_id": "call_2",
         "output": [{"type": "input_text", "text": "Done!"}, {"type": "input_text", "text": "1 file"}]},
        {"type": "message", "role": "developer", "content": "Approval mode changed."},
        {"type": "reasoning", "summary": [], "encrypted_content": "gAAAA"},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "All good."}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Done."}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "thanks"}]},
    ]  # fmt: skip
    body = openai_responses.normalize(
        {
            "model": "m",
            "input": history,
            "tools": [CUSTOM_TOOL],
            "tool_choice": {"type": "custom", "name": "apply_patch"},
        }
    ).engine_body
    assert body["messages"] == [
        {"role": "user", "content": "weather and a file"},
        {"role": "assistant", "reasoning": "Check both, in parallel.", "content": "On it.", "tool_calls": [
            _call("call_1", "get_weather", {"city": "Paris"}), _call("call_2", "apply_patch", {"input": PATCH})]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call_2", "content": "Done!\n1 file"},
        {"role": "system", "content": "Approval mode changed."},  # stays in place: earlier prompts stay a prefix
        {"role": "assistant", "reasoning": "All good.", "content": "Done."},
        {"role": "user", "content": "thanks"},
    ]  # fmt: skip
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "apply_patch",
                "description": "Edit files",
                "parameters": openai_responses.CUSTOM_PARAMETERS,
            },
        }
    ]
    assert body["tool_choice"] == {"type": "function", "function": {"name": "apply_patch"}}


def test_normalize_tool_choices() -> None:
    tools = [{"type": "function", "name": "f", "parameters": {"type": "object"}}]
    for choice, expected in (("required", "required"), ({"type": "function", "name": "f"},
                             {"type": "function", "function": {"name": "f"}}),
                             ({"type": "allowed_tools", "mode": "required", "tools": []}, "required")):  # fmt: skip
        body = openai_responses.normalize({"model": "m", "input": "x", "tools": tools, "tool_choice": choice})
        assert body.engine_body["tool_choice"] == expected
    only_hosted = openai_responses.normalize({"model": "m", "input": "x", "tools": [{"type": "web_search"}]})
    assert "tools" not in only_hosted.engine_body and "tool_choice" not in only_hosted.engine_body


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ([], "JSON object"),
        ({"input": "hi"}, "model"),
        ({"model": "m"}, "input: required"),
        ({"model": "m", "input": []}, "input: required"),
        ({"model": "m", "input": "hi", "previous_response_id": "resp_1"}, "full history"),
        ({"model": "m", "input": "hi", "stream": "yes"}, "stream"),
        ({"model": "m", "input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
        ({"model": "m", "input": "hi", "temperature": "hot"}, "temperature"),
        ({"model": "m", "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
         "must be a data URL"),
        ({"model": "m", "input": [{"role": "user", "content": [{"type": "input_image", "file_id": "file-1"}]}]},
         "no file store"),
        ({"model": "m", "input": [{"role": "user", "content": [{"type": "input_file", "file_id": "file-1"}]}]},
         "input_file is not supported"),
        ({"model": "m", "input": [{"type": "function_call_output", "call_id": "c",
                                   "output": [{"type": "input_file", "file_id": "f"}]}]}, "input_file"),
        ({"model": "m", "input": [{"type": "item_reference", "id": "x"}]}, "'item_reference' is not supported"),
        ({"model": "m", "input": [{"role": "tool", "content": "x"}]}, "role"),
        ({"model": "m", "input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "call_id"),
        ({"model": "m", "input": [{"type": "custom_tool_call", "call_id": "c", "name": "f"}]}, "input"),
        ({"model": "m", "input": "hi", "tools": [{"type": "file_search"}]}, "'file_search' is not supported"),
        ({"model": "m", "input": "hi", "tools": [{"type": "function"}]}, "name"),
        ({"model": "m", "input": "hi", "tools": [CUSTOM_TOOL, CUSTOM_TOOL]}, "already defined"),
        ({"model": "m", "input": "hi", "tools": [{"type": "function", "name": "f"}],
          "tool_choice": {"type": "file_search"}}, "tool_choice"),
    ],
)  # fmt: skip
def test_normalize_rejects(body: Any, words: str) -> None:
    with pytest.raises(ValidationError) as caught:
        openai_responses.normalize(body)
    assert words in caught.value.message


def test_render_tool_turn() -> None:
    request = openai_responses.normalize(
        {"model": "my-model", "input": "go", "tools": [CUSTOM_TOOL, CODEX_REQUEST["tools"][1]], "temperature": 0.5}
    )
    calls = [_call("chatcmpl-tool-a", "close_agent", {"target": "x"}),
             _call("chatcmpl-tool-b", "apply_patch", {"input": PATCH})]  # fmt: skip
    message = {"content": "\n\n", "reasoning": "\nI will patch.\n", "tool_calls": calls}
    body = openai_responses.render_response(
        request, _answer(message, "tool_calls", prompt_tokens_details={"cached_tokens": 8})
    )
    Response.model_validate(body)
    assert body["output"] == [
        {"id": "rs_9f3a", "type": "reasoning", "summary": [{"type": "summary_text", "text": "I will patch."}],
         "content": [{"type": "reasoning_text", "text": "I will patch."}]},
        {"id": "fc_9f3a_0", "type": "function_call", "call_id": "chatcmpl-tool-a", "name": "close_agent",
         "namespace": "multi_agent_v1", "arguments": "{\"target\": \"x\"}", "status": "completed"},
        {"id": "ctc_9f3a_1", "type": "custom_tool_call", "call_id": "chatcmpl-tool-b", "name": "apply_patch",
         "input": PATCH},
    ]  # fmt: skip
    assert body["id"] == "resp_9f3a" and body["model"] == "my-model" and body["status"] == "completed"
    assert body["usage"] == {
        "input_tokens": 20,
        "input_tokens_details": {"cached_tokens": 8, "cache_write_tokens": 0},
        "output_tokens": 3,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 23,
    }
    assert body["temperature"] == 0.5 and body["tool_choice"] == "auto" and body["tools"][0] == CUSTOM_TOOL


def test_render_text_and_length() -> None:
    request = openai_responses.normalize({"model": "m", "input": "hi"})
    text = openai_responses.render_response(request, _answer({"content": "\n\nHello", "reasoning": "Hi back."}))
    assert [item["type"] for item in text["output"]] == ["reasoning", "message"]
    assert text["output"][1]["content"][0]["text"] == "Hello" and text["incomplete_details"] is None
    plain = openai_responses.render_response(request, _answer({"content": "  Hello"}))
    assert plain["output"][0]["content"][0]["text"] == "  Hello"
    cut = openai_responses.render_response(request, _answer({"content": "Hel"}, "length"))
    Response.model_validate(cut)
    assert cut["status"] == "incomplete" and cut["incomplete_details"] == {"reason": "max_output_tokens"}
    odd = openai_responses.normalize({"model": "m", "input": "x", "tools": [CUSTOM_TOOL]})
    raw = {"tool_calls": [{"id": "c", "type": "function", "function": {"name": "apply_patch", "arguments": "x"}}]}
    assert openai_responses.render_response(odd, _answer(raw, "tool_calls"))["output"][0]["input"] == "x"


def test_stream_event_order() -> None:
    request = openai_responses.normalize({"model": "m", "input": "go", "tools": [CUSTOM_TOOL], "stream": True})
    message = {"content": "\n\nPatching now.", "reasoning": "Plan.",
               "tool_calls": [_call("chatcmpl-tool-b", "apply_patch", {"input": PATCH})]}  # fmt: skip
    chunks = list(openai_responses.render_stream(request, _answer(message, "tool_calls")))
    events = _events(chunks)
    assert [e["type"] for e in events] == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.reasoning_summary_part.added", "response.reasoning_summary_text.delta",
        "response.reasoning_summary_text.done", "response.reasoning_summary_part.done",
        "response.reasoning_text.delta", "response.reasoning_text.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.custom_tool_call_input.delta", "response.custom_tool_call_input.done",
        "response.output_item.done", "response.completed",
    ]  # fmt: skip
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[0]["response"]["status"] == "in_progress" and events[0]["response"]["output"] == []
    assert events[4]["summary_index"] == 0 and events[7]["content_index"] == 0 and events[7]["delta"] == "Plan."
    assert events[12]["delta"] == "Patching now." and events[12]["logprobs"] == []
    final = events[-1]["response"]
    assert final["id"] == events[0]["response"]["id"] and final["usage"]["total_tokens"] == 23
    assert [e["item"] for e in events if e["type"] == "response.output_item.done"] == final["output"]
    assert b"[DONE]" not in b"".join(chunks)


def test_stream_function_call_and_incomplete() -> None:
    request = openai_responses.normalize({"model": "m", "input": "go", "stream": True})
    calls = _events(list(openai_responses.render_stream(request, _answer({"tool_calls": [_call("c1", "f", {})]}))))
    assert [e["type"] for e in calls[2:]] == [
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done", "response.completed",
    ]  # fmt: skip
    assert calls[2]["item"]["arguments"] == "" and calls[4]["arguments"] == "{}" and calls[4]["name"] == "f"
    cut = _events(list(openai_responses.render_stream(request, _answer({"content": "Hel"}, "length"))))
    assert cut[-1]["type"] == "response.incomplete" and cut[-1]["response"]["status"] == "incomplete"


def test_errors_count_tokens_and_models() -> None:
    assert openai_responses.render_error(400, "bad") == {
        "error": {"message": "bad", "type": "invalid_request_error", "param": None, "code": None}
    }
    assert openai_responses.render_error(401, "who")["error"]["code"] == "invalid_api_key"
    error, failed = openai_responses.render_stream_error(502, "engine down").decode().strip().split("\n\n")
    assert (
        error.startswith("event: error\n") and json.loads(error.split("data: ")[1])["error"]["message"] == "engine down"
    )
    failure = json.loads(failed.split("data: ")[1])["response"]
    assert failed.startswith("event: response.failed\n") and failure["status"] == "failed"
    assert failure["error"] == {"code": "server_error", "message": "engine down"}
    tokenize = openai_responses.count_tokens_request({"input": "hi", "instructions": "sys", "tools": [CUSTOM_TOOL]})
    assert tokenize["messages"] == [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}]
    assert tokenize["tools"][0]["function"]["name"] == "apply_patch"
    assert openai_responses.render_count_tokens(7) == {"object": "response.input_tokens", "input_tokens": 7}
    assert openai_responses.render_models(["m"])["data"][0]["id"] == "m"
