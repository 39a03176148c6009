"""The Gemini protocol on recorded payloads: gemini-cli / google-genai requests normalised to the engine's chat
shape, engine answers rendered as responses and SSE chunks, errors, count_tokens and the model list."""

from __future__ import annotations

import json
from typing import Any

import pytest

from polar.errors import ValidationError
from polar.protocols import detect, gemini, gemini_request
from polar.protocols._base import ClientRequest, EngineAnswer, RequestContext

# What gemini-cli sends on its second turn (trimmed): thoughts and a call it echoes back, then the result.
CLI_REQUEST: dict[str, Any] = {
    "contents": [
        {"role": "user", "parts": [{"text": "<session_context>cwd: /work</session_context>"}, {"text": "list files"}]},
        {
            "role": "model",
            "parts": [
                {"text": "**Listing** I will run ls.", "thought": True},
                {"functionCall": {"id": "c1", "name": "ls", "args": {"path": "."}}, "thoughtSignature": "sig"},
            ],
        },
        {"role": "user", "parts": [{"functionResponse": {"id": "c1", "name": "ls", "response": {"output": "a b"}}}]},
    ],
    "systemInstruction": {"role": "user", "parts": [{"text": "You are a CLI agent."}]},
    "tools": [
        {"functionDeclarations": [{"name": "ls", "description": "List", "parametersJsonSchema": {"type": "object"}}]}
    ],
    "toolConfig": {"functionCallingConfig": {"mode": "AUTO"}},
    "generationConfig": {
        "temperature": 0,
        "topP": 1,
        "topK": 64,
        "maxOutputTokens": 65536,
        "thinkingConfig": {"thinkingBudget": -1, "includeThoughts": True},
    },
    "safetySettings": [{"category": "HARM_CATEGORY_HARASSMENT", "threshold": "BLOCK_NONE"}],
}
STREAM = RequestContext({"model": "gemini-2.5-pro"}, {"alt": "sse"}, {}, True)


def _answer(
    content: str = "\n\nHello there.",
    reasoning: str | None = "\nLet me think.\n",
    tool_calls: list[dict[str, Any]] | None = None,
    finish: str = "stop",
    tokens: list[str] | None = None,
) -> EngineAnswer:
    tokens = tokens if tokens is not None else ["<think>", "Let", " me", "</think>", "\n\n", "Hello", "<|im_end|>"]
    message = {"role": "assistant", "content": content, "reasoning": reasoning, "tool_calls": tool_calls or []}
    choice = {
        "index": 0,
        "message": message,
        "logprobs": {"content": [{"token": t, "logprob": -0.1} for t in tokens]},
        "finish_reason": finish,
        "stop_reason": None,
        "token_ids": list(range(len(tokens))),
    }
    usage = {"prompt_tokens": 20, "completion_tokens": len(tokens), "total_tokens": 20 + len(tokens)}
    body = {
        "id": "chatcmpl-abc",
        "model": "polar-reference",
        "choices": [choice],
        "usage": usage,
        "prompt_token_ids": list(range(20)),
    }
    return EngineAnswer(body)


def _call(name: str = "ls", arguments: str = '{"path": "."}', call_id: str = "chatcmpl-tool-1") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _request(include_thoughts: bool = False, sse: bool = True) -> ClientRequest:
    options = {"include_thoughts": include_thoughts, "sse": sse}
    return ClientRequest("gemini", {}, True, "gemini-2.5-pro", options)


def _events(raw: list[bytes]) -> list[dict[str, Any]]:
    assert all(event.startswith(b"data: ") and event.endswith(b"\n\n") for event in raw)
    return [json.loads(event[6:]) for event in raw]


def test_routes_are_detected() -> None:
    stream = detect("POST", "/v1beta/models/gemini-2.5-pro:streamGenerateContent", {}, {"alt": "sse"})
    assert stream is not None and stream.protocol is gemini and stream.operation == "generate"
    assert stream.context.stream is True and stream.context.path_params == {"model": "gemini-2.5-pro"}
    plain = detect("POST", "/v1/models/m:generateContent", {}, {})
    assert plain is not None and plain.context.stream is False
    count = detect("POST", "/v1beta/models/m:countTokens", {}, {})
    assert count is not None and (count.protocol, count.operation) == (gemini, "count_tokens")
    listing = detect("GET", "/v1beta/models", {}, {})
    assert listing is not None and (listing.protocol, listing.operation) == (gemini, "models")
    shared = detect("GET", "/v1/models", {"x-goog-api-key": "k"}, {})
    assert shared is not None and shared.protocol is gemini
    assert detect("POST", "/v1beta/models/a/b:generateContent", {}, {}) is None


def test_normalizes_a_gemini_cli_turn() -> None:
    request = gemini.normalize(CLI_REQUEST, STREAM)
    assert (request.provider, request.stream, request.model) == ("gemini", True, "gemini-2.5-pro")
    assert request.options == {"include_thoughts": True, "sse": True, "images": ()}
    assert request.engine_body == {
        "messages": [
            {"role": "system", "content": "You are a CLI agent."},
            {"role": "user", "content": "<session_context>cwd: /work</session_context>\nlist files"},
            {
                "role": "assistant",
                "content": "",
                "reasoning": "**Listing** I will run ls.",
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": '{"path": "."}'}}
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": '{"output":"a b"}'},
        ],
        "tools": [
            {"type": "function", "function": {"name": "ls", "description": "List", "parameters": {"type": "object"}}}
        ],
        "temperature": 0,
        "top_p": 1,
        "top_k": 64,
        "max_tokens": 32768,
    }


def test_snake_case_single_objects_and_prefill() -> None:
    body = {
        "system_instruction": {"parts": {"text": "Be brief."}},
        "contents": [
            {"role": "user", "parts": {"text": "Say hi"}},
            {"role": "model", "parts": [{"text": "Hi"}, {"text": " the"}, {"thought_signature": "x"}]},
        ],
        "generation_config": {
            "max_output_tokens": 5,
            "stop_sequences": ["\n"],
            "thinking_config": {"thinking_budget": 0},
        },
    }
    engine_body = gemini.normalize(body).engine_body
    assert engine_body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Say hi"},
        {"role": "assistant", "content": "Hi the"},
    ]
    assert engine_body["continue_final_message"] is True and engine_body["add_generation_prompt"] is False
    assert engine_body["max_tokens"] == 5 and engine_body["stop"] == ["\n"]
    assert engine_body["chat_template_kwargs"] == {"enable_thinking": False}
    assert gemini.normalize({"systemInstruction": "Sys", "contents": [{"parts": [{"text": "x"}]}]}).engine_body[
        "messages"
    ] == [{"role": "system", "content": "Sys"}, {"role": "user", "content": "x"}]


def test_function_responses_pair_with_their_calls() -> None:
    body = {
        "contents": [
            {"role": "user", "parts": [{"text": "go"}]},
            {
                "role": "model",
                "parts": [
                    {"functionCall": {"name": "read", "args": {"f": "a"}}},
                    {"functionCall": {"name": "read", "args": {"f": "b"}}},
                    {"functionCall": {"id": "engine-3", "name": "ls"}},
                ],
            },
            {
                "role": "user",
                "parts": [
                    {"functionResponse": {"name": "ls", "response": {"r": 3}}},
                    {"functionResponse": {"name": "read", "response": {"r": 1}}},
                    {"functionResponse": {"id": "stranger", "name": "read", "response": {"r": 2}}},
                    {"text": "and then?"},
                ],
            },
            {"role": "model", "parts": [{"functionCall": {"name": "ls", "args": {}}}]},
            {
                "role": "function",
                "parts": [
                    {"functionResponse": {"id": "engine-3", "name": "ls", "response": {}}},
                    {"functionResponse": {"name": "gone"}},
                ],
            },
        ]
    }
    messages = gemini.normalize(body).engine_body["messages"]
    calls = [[c["id"] for c in m["tool_calls"]] for m in messages if m["role"] == "assistant"]
    assert calls == [["call_1_0", "call_1_1", "engine-3"], ["call_3_0"]]
    assert [(m["role"], m.get("tool_call_id"), m["content"]) for m in messages[2:]] == [
        ("tool", "engine-3", '{"r":3}'),
        ("tool", "call_1_0", '{"r":1}'),
        ("tool", "call_1_1", '{"r":2}'),
        ("user", None, "and then?"),
        ("assistant", None, ""),
        ("tool", "engine-3", "{}"),
        ("tool", "call_3_0", "{}"),
    ]
    assert json.loads(messages[1]["tool_calls"][2]["function"]["arguments"]) == {}


def test_openapi_parameters_become_json_schema() -> None:
    parameters = {
        "type": "OBJECT",
        "properties": {
            "path": {"type": "STRING", "description": "where", "nullable": True},
            "flags": {
                "type": "ARRAY",
                "items": {"type": "STRING", "enum": ["a", "b"], "format": "enum"},
                "max_items": 3,
            },
            "mode": {"any_of": [{"type": "INTEGER"}, {"type": "BOOLEAN"}]},
            "type": {"type": "TYPE_UNSPECIFIED"},
        },
        "required": ["path"],
        "propertyOrdering": ["path", "flags"],
    }
    body = {
        "contents": [{"parts": [{"text": "x"}]}],
        "tools": [{"function_declarations": [{"name": "f", "parameters": parameters}, {"name": "g"}]}],
        "toolConfig": {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["g"]}},
    }
    engine_body = gemini.normalize(body).engine_body
    assert engine_body["tools"][0]["function"]["parameters"] == {
        "type": "object",
        "properties": {
            "path": {"type": ["string", "null"], "description": "where"},
            "flags": {
                "type": "array",
                "items": {"type": "string", "enum": ["a", "b"], "format": "enum"},
                "maxItems": 3,
            },
            "mode": {"anyOf": [{"type": "integer"}, {"type": "boolean"}]},
            "type": {},
        },
        "required": ["path"],
    }
    assert engine_body["tools"][1] == {"type": "function", "function": {"name": "g"}}
    assert engine_body["tool_choice"] == {"type": "function", "function": {"name": "g"}}


@pytest.mark.parametrize(
    ("config", "choice"),
    [
        ({"mode": "NONE"}, "none"),
        ({"mode": "ANY"}, "required"),
        ({"mode": "ANY", "allowedFunctionNames": ["f", "g"]}, "required"),
        ({"mode": "AUTO"}, None),
        ({"mode": "VALIDATED"}, None),
    ],
)
def test_function_calling_modes(config: dict[str, Any], choice: Any) -> None:
    tools = [{"functionDeclarations": [{"name": "f"}, {"name": "g"}]}]
    body = {"contents": [{"parts": [{"text": "x"}]}], "tools": tools, "toolConfig": {"functionCallingConfig": config}}
    assert gemini.normalize(body).engine_body.get("tool_choice") == choice


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ([], "JSON object"),
        ({}, "contents"),
        ({"contents": []}, "contents"),
        ({"contents": "hi"}, "contents"),
        ({"contents": [{"role": "user"}]}, "parts"),
        ({"contents": ["hi"]}, "Content object"),
        ({"contents": [{"parts": ["hi"]}]}, "must be an object"),
        ({"contents": [{"role": "model", "parts": [{"functionCall": "f"}]}]}, "functionCall: must be an object"),
        ({"contents": [{"parts": [{"text": "x"}]}], "tools": ["f"]}, "Tool object"),
        (
            {
                "contents": [{"parts": [{"text": "x"}]}],
                "tools": [{"functionDeclarations": [{"name": "f", "parameters": 1}]}],
            },
            "schema object",
        ),
        ({"contents": [{"role": "system", "parts": [{"text": "x"}]}]}, "role"),
        ({"contents": [{"parts": [{"text": 1}]}]}, "text"),
        ({"contents": [{"parts": [{"inlineData": {"mimeType": "image/png", "data": "AA=="}}]}]}, "not a PNG"),
        (
            {"contents": [{"parts": [{"file_data": {"fileUri": "gs://x", "mimeType": "application/pdf"}}]}]},
            "not supported",
        ),
        ({"contents": [{"parts": [{"executableCode": {"code": "1"}}]}]}, "not supported"),
        ({"contents": [{"parts": [{"functionCall": {"name": "f"}}]}]}, "model turn"),
        ({"contents": [{"role": "model", "parts": [{"functionResponse": {"name": "f"}}]}]}, "user turn"),
        ({"contents": [{"role": "model", "parts": [{"functionCall": {"name": "f", "args": [1]}}]}]}, "args"),
        ({"contents": [{"role": "model", "parts": [{"functionCall": {"args": {}}}]}]}, "name"),
        ({"contents": [{"parts": [{"functionResponse": {"name": "f", "response": "ok"}}]}]}, "response"),
        ({"contents": [{"parts": [{"functionResponse": {"name": "f", "parts": [{"inlineData": {}}]}}]}]}, "base64"),
        ({"contents": [{"parts": [{"functionResponse": {"name": "f", "parts": [{"text": "x"}]}}]}]}, "image parts"),
        (
            {
                "contents": [{"parts": [{"text": "x"}]}],
                "systemInstruction": {"parts": [{"functionCall": {"name": "f"}}]},
            },
            "system",
        ),
        ({"contents": [{"parts": [{"text": "x"}]}], "systemInstruction": 3}, "systemInstruction"),
        ({"contents": [{"parts": [{"text": "x"}]}], "tools": [{"googleSearch": {}}]}, "googleSearch"),
        (
            {"contents": [{"parts": [{"text": "x"}]}], "tools": [{"functionDeclarations": [{"description": "d"}]}]},
            "name",
        ),
        (
            {
                "contents": [{"parts": [{"text": "x"}]}],
                "tools": [
                    {
                        "functionDeclarations": [
                            {"name": "f", "parameters": {"type": "OBJECT"}, "parametersJsonSchema": {"type": "object"}}
                        ]
                    }
                ],
            },
            "not both",
        ),
        ({"contents": [{"parts": [{"text": "x"}]}], "toolConfig": {"functionCallingConfig": {"mode": "ANY"}}}, "ANY"),
        (
            {"contents": [{"parts": [{"text": "x"}]}], "toolConfig": {"functionCallingConfig": {"mode": "SOMETIMES"}}},
            "mode",
        ),
        (
            {
                "contents": [{"parts": [{"text": "x"}]}],
                "tools": [{"functionDeclarations": [{"name": "f"}]}],
                "toolConfig": {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["h"]}},
            },
            "declared",
        ),
        ({"contents": [{"parts": [{"text": "x"}]}], "generationConfig": []}, "generationConfig"),
        ({"contents": [{"parts": [{"text": "x"}]}], "generationConfig": {"maxOutputTokens": "9"}}, "maxOutputTokens"),
        ({"contents": [{"parts": [{"text": "x"}]}], "generationConfig": {"maxOutputTokens": 0}}, "maxOutputTokens"),
        ({"contents": [{"parts": [{"text": "x"}]}], "generationConfig": {"temperature": True}}, "temperature"),
        ({"contents": [{"parts": [{"text": "x"}]}], "generationConfig": {"candidateCount": 2}}, "candidateCount"),
        ({"contents": [{"parts": [{"text": "x"}]}], "generationConfig": {"stopSequences": "x"}}, "stopSequences"),
        ({"contents": [{"parts": [{"text": "x"}]}], "generationConfig": {"thinkingConfig": 1}}, "thinkingConfig"),
    ],
)
def test_bad_input_is_rejected(body: Any, needle: str) -> None:
    with pytest.raises(ValidationError) as caught:
        gemini.normalize(body, STREAM)
    assert needle in caught.value.message


def test_optional_fields_are_accepted_and_ignored() -> None:
    body = {
        "contents": [{"parts": [{"text": "x"}]}],
        "systemInstruction": [{"text": "a"}, {"text": "b"}],
        "tools": [{"functionDeclarations": [], "googleSearch": None}],
        "toolConfig": {},
        "cachedContent": "cachedContents/1",
        "safetySettings": [],
        "generationConfig": {"responseMimeType": "application/json", "presencePenalty": -0.5, "seed": 7},
    }
    engine_body = gemini.normalize(body).engine_body
    messages = [{"role": "system", "content": "a\nb"}, {"role": "user", "content": "x"}]
    assert engine_body == {"messages": messages, "presence_penalty": -0.5, "seed": 7}
    mixed = {"contents": [{"parts": [{"text": "see:"}, {"functionResponse": {"name": "f", "response": {"a": "é"}}}]}]}
    assert gemini.normalize(mixed).engine_body["messages"] == [
        {"role": "user", "content": "see:"},
        {"role": "tool", "tool_call_id": "call_0_1", "content": '{"a":"é"}'},
    ]
    loose = {"type": "OBJECT", "additionalProperties": False, "items": [{"type": "STRING"}]}
    assert gemini_request.json_schema(loose) == {
        "type": "object",
        "additionalProperties": False,
        "items": [{"type": "STRING"}],
    }


def test_response_hides_thoughts_unless_asked() -> None:
    answer = _answer()
    hidden = gemini.render_response(_request(), answer)
    assert hidden == {
        "candidates": [
            {"content": {"role": "model", "parts": [{"text": "Hello there."}]}, "finishReason": "STOP", "index": 0}
        ],
        "usageMetadata": {
            "promptTokenCount": 20,
            "candidatesTokenCount": 3,
            "totalTokenCount": 27,
            "thoughtsTokenCount": 4,
        },
        "modelVersion": "gemini-2.5-pro",
        "responseId": "chatcmpl-abc",
    }
    shown = gemini.render_response(_request(include_thoughts=True), answer)
    assert shown["candidates"][0]["content"]["parts"] == [
        {"text": "Let me think.", "thought": True},
        {"text": "Hello there."},
    ]


def test_response_with_calls_and_stop_reasons() -> None:
    calls = [_call(), _call("read", '{"f": "a"}', "chatcmpl-tool-2")]
    answer = _answer(content="\n\n", tool_calls=calls, finish="tool_calls")
    candidate = gemini.render_response(_request(), answer)["candidates"][0]
    assert candidate["finishReason"] == "STOP"
    assert candidate["content"]["parts"] == [
        {"functionCall": {"id": "chatcmpl-tool-1", "name": "ls", "args": {"path": "."}}},
        {"functionCall": {"id": "chatcmpl-tool-2", "name": "read", "args": {"f": "a"}}},
    ]
    cut = gemini.render_response(_request(), _answer(content="", reasoning="\nLet", finish="length", tokens=["a"]))
    assert cut["candidates"][0] == {
        "content": {"role": "model", "parts": [{"text": ""}]},  # never a candidate without parts
        "finishReason": "MAX_TOKENS",
        "index": 0,
    }
    assert cut["usageMetadata"]["thoughtsTokenCount"] == 1 and cut["usageMetadata"]["candidatesTokenCount"] == 0
    plain = gemini.render_response(_request(), _answer(content="Hi", reasoning=None, tokens=["Hi", "<|im_end|>"]))
    assert plain["candidates"][0]["content"]["parts"] == [{"text": "Hi"}]
    assert plain["usageMetadata"]["thoughtsTokenCount"] == 0
    bad = gemini.render_response(_request(), _answer(tool_calls=[_call(arguments="[1")], finish="tool_calls"))
    assert (
        bad["candidates"][0]["finishReason"] == "MALFORMED_FUNCTION_CALL"
        and "ls" in bad["candidates"][0]["finishMessage"]
    )
    reported = _answer()
    reported.body["usage"].update(
        completion_tokens_details={"reasoning_tokens": 2}, prompt_tokens_details={"cached_tokens": 8}
    )
    assert gemini.render_response(_request(), reported)["usageMetadata"] == {
        "promptTokenCount": 20,
        "candidatesTokenCount": 5,
        "totalTokenCount": 27,
        "thoughtsTokenCount": 2,
        "cachedContentTokenCount": 8,
    }
    odd = _answer(tokens=["Hi"], finish="abort")
    assert gemini.render_response(_request(), odd)["candidates"][0]["finishReason"] == "OTHER"
    assert "thoughtsTokenCount" not in gemini.render_response(_request(), odd)["usageMetadata"]


def test_stream_chunks_end_with_finish_and_usage() -> None:
    answer = _answer(tool_calls=[_call()], finish="tool_calls")
    events = _events(list(gemini.render_stream(_request(include_thoughts=True), answer)))
    assert [e["candidates"][0]["content"]["parts"] for e in events] == [
        [{"text": "Let me think.", "thought": True}],
        [{"text": "Hello there."}],
        [{"functionCall": {"id": "chatcmpl-tool-1", "name": "ls", "args": {"path": "."}}}],
    ]
    assert [e["candidates"][0].get("finishReason") for e in events] == [None, None, "STOP"]
    assert ["usageMetadata" in e for e in events] == [False, False, True]
    assert all(e["modelVersion"] == "gemini-2.5-pro" and e["responseId"] == "chatcmpl-abc" for e in events)
    single = _events(list(gemini.render_stream(_request(), _answer(content="", reasoning=None, tokens=[]))))
    assert single == [gemini.render_response(_request(), _answer(content="", reasoning=None, tokens=[]))]


def test_stream_without_alt_sse_is_a_json_array() -> None:
    raw = b"".join(gemini.render_stream(_request(include_thoughts=True, sse=False), _answer()))
    chunks = json.loads(raw)
    assert len(chunks) == 2 and chunks[-1]["candidates"][0]["finishReason"] == "STOP"


def test_errors_in_google_shape() -> None:
    expected = {
        400: "INVALID_ARGUMENT",
        401: "UNAUTHENTICATED",
        403: "PERMISSION_DENIED",
        404: "NOT_FOUND",
        413: "INVALID_ARGUMENT",
        429: "RESOURCE_EXHAUSTED",
        500: "INTERNAL",
        502: "UNAVAILABLE",
        503: "UNAVAILABLE",
        504: "DEADLINE_EXCEEDED",
        507: "INTERNAL",
    }
    for status, kind in expected.items():
        assert gemini.render_error(status, "boom") == {"error": {"code": status, "message": "boom", "status": kind}}
    assert gemini.render_stream_error(500, "x") == b'data: {"error":{"code":500,"message":"x","status":"INTERNAL"}}\n\n'


def test_count_tokens_models() -> None:
    contents = [{"role": "user", "parts": [{"text": "hi"}]}, {"role": "model", "parts": [{"text": "Hel"}]}]
    tools = [{"functionDeclarations": [{"name": "f"}]}]
    direct = gemini.count_tokens_request({"contents": contents, "tools": tools}, STREAM)
    assert direct == {
        "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hel"}],
        "tools": [{"type": "function", "function": {"name": "f"}}],
        "add_generation_prompt": False,
        "continue_final_message": True,
    }
    wrapped = {
        "generateContentRequest": {
            "model": "models/m",
            "contents": contents[:1],
            "systemInstruction": "s",
            "generationConfig": {"thinkingConfig": {"thinkingBudget": 0}},
        }
    }
    assert gemini.count_tokens_request(wrapped) == {
        "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}],
        "chat_template_kwargs": {"enable_thinking": False},
    }
    with pytest.raises(ValidationError):
        gemini.count_tokens_request({"generateContentRequest": []})
    with pytest.raises(ValidationError):
        gemini.count_tokens_request({})
    assert gemini.render_count_tokens(12) == {"totalTokens": 12}
    listing = gemini.render_models(["qwen3"])
    assert listing["models"][0]["name"] == "models/qwen3"
    assert listing["models"][0]["supportedGenerationMethods"] == ["generateContent", "countTokens"]
