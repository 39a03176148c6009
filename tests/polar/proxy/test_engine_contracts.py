"""Contract tests: every body the proxy sends to an engine and every answer it parses, validated against JSON
Schemas recorded from the engines' own sources (``tests/contracts/<engine>/*.json``; each names its project,
source path, commit and version under ``x-source``).

Request schemas forbid unknown properties: vLLM accepts and ignores a field it does not know (it only logs a
warning), so a misspelt capture switch would silently capture nothing. The reference engine's answers are
validated too, since the proxy's code path against it is the one it takes against vLLM and SGLang.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest

from polar.chat.chat_template import ChatTemplate
from polar.chat.conversation import normalise_messages
from polar.chat.tokenizer import load_tokenizer
from polar.fleet.backends import sglang
from polar.fleet.backends import vllm as vllm_backend
from polar.fleet.backends.base import capture_fields
from polar.local.launcher import Stack, engine_spec, free_port
from polar.protocols import RequestContext, anthropic, gemini, openai_chat, openai_responses
from polar.protocols._base import EngineAnswer
from tests.real_vllm import SharedVllm

CONTRACTS = Path(__file__).resolve().parents[2] / "contracts"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calc",
            "description": "Evaluate.",
            "parameters": {"type": "object", "properties": {"x": {"type": "string"}}},
        },
    }
]
SAY = {
    "turns": [
        {"reasoning": "Use the tool.", "tool_calls": [{"name": "calc", "arguments": {"x": "1+1"}}]},
        {"content": "It is 2."},
    ]
}


def schema(engine: str, name: str) -> dict[str, Any]:
    return json.loads((CONTRACTS / engine / f"{name}.json").read_text())


def check(engine: str, name: str, body: Any) -> None:
    contract = schema(engine, name)
    jsonschema.validate(body, contract, cls=jsonschema.Draft202012Validator)


def test_every_schema_names_its_source() -> None:
    for path in CONTRACTS.glob("*/*.json"):
        contract = json.loads(path.read_text())
        if "x-source" in contract:
            assert contract["x-source"]["project"] and contract["x-source"]["path"], path
            jsonschema.Draft202012Validator.check_schema(contract)


CLIENT_REQUESTS: list[tuple[Any, dict[str, Any], RequestContext]] = [
    (
        openai_chat,
        {
            "model": "m",
            "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}],
            "tools": TOOLS,
            "tool_choice": "auto",
            "max_tokens": 64,
            "temperature": 0.7,
            "stop": ["X"],
            "stream": True,
            "stream_options": {"include_usage": True},
            "parallel_tool_calls": True,
            "top_logprobs": 2,
            "logprobs": True,
            "seed": 3,
        },
        RequestContext(),
    ),
    (
        openai_chat,
        {
            "model": "m",
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "q"}]},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "calc", "arguments": "{}"}}],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "2"},
            ],
            "tools": TOOLS,
        },
        RequestContext(),
    ),
    (
        anthropic,
        {
            "model": "claude",
            "max_tokens": 128,
            "system": [{"type": "text", "text": "sys"}],
            "messages": [
                {"role": "user", "content": "hi"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "t", "signature": "s"},
                        {"type": "tool_use", "id": "toolu_1", "name": "calc", "input": {"x": "1"}},
                    ],
                },
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "1"}]},
            ],
            "tools": [{"name": "calc", "input_schema": {"type": "object"}}],
            "stream": True,
            "thinking": {"type": "enabled", "budget_tokens": 1024},
            "stop_sequences": ["Z"],
        },
        RequestContext(),
    ),
    (
        anthropic,
        {
            "model": "claude",
            "max_tokens": 16,
            "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure"}],
        },
        RequestContext(),
    ),
    (
        openai_responses,
        {
            "model": "m",
            "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
            "instructions": "be brief",
            "tools": [{"type": "function", "name": "calc", "parameters": {"type": "object"}}],
            "stream": True,
            "store": False,
            "max_output_tokens": 64,
            "reasoning": {"effort": "low"},
            "include": ["reasoning.encrypted_content"],
        },
        RequestContext(),
    ),
    (
        gemini,
        {
            "contents": [{"role": "user", "parts": [{"text": "hi"}]}],
            "systemInstruction": {"parts": [{"text": "s"}]},
            "tools": [{"functionDeclarations": [{"name": "calc", "parametersJsonSchema": {"type": "object"}}]}],
            "generationConfig": {
                "temperature": 0.5,
                "maxOutputTokens": 64,
                "stopSequences": ["Q"],
                "thinkingConfig": {"includeThoughts": True},
            },
        },
        RequestContext({"model": "gemini-2.5-pro"}, {}, {}, False),
    ),
]


@pytest.mark.parametrize(("protocol", "body", "context"), CLIENT_REQUESTS)
def test_chat_bodies_the_proxy_sends_are_valid_vllm_requests(protocol: Any, body: Any, context: Any) -> None:
    engine_body = protocol.normalize(body, context).engine_body
    sent = {**capture_fields(engine_body), "model": "served"}
    check("vllm", "chat_completion_request", sent)
    assert sent["return_token_ids"] is True and sent["logprobs"] is True and sent["stream"] is False


@pytest.mark.parametrize(("protocol", "body", "context"), CLIENT_REQUESTS)
def test_tokenize_bodies_are_valid(protocol: Any, body: Any, context: Any) -> None:
    if hasattr(protocol, "count_tokens_request"):
        check("vllm", "tokenize_request", {**protocol.count_tokens_request(body, context), "model": "served"})


def test_tito_bodies_are_valid() -> None:
    chat = openai_chat.normalize(CLIENT_REQUESTS[0][1], RequestContext()).engine_body
    check("vllm", "completion_request", {**vllm_backend.completion_body(chat, [1, 2, 3]), "model": "served"})
    render = {
        "messages": chat["messages"],
        "add_generation_prompt": True,
        "tools": TOOLS,
        "chat_template_kwargs": {"enable_thinking": False},
        "model": "served",
    }
    check("vllm", "tokenize_request", render)
    check("vllm", "tokenize_request", {"prompt": "tail", "add_special_tokens": False, "model": "served"})
    check("vllm", "detokenize_request", {"tokens": [1, 2], "model": "served"})


def test_a_field_vllm_does_not_know_fails_the_contract() -> None:
    with pytest.raises(jsonschema.ValidationError, match="return_token_id"):
        check(
            "vllm", "chat_completion_request", {"messages": [{"role": "user", "content": "x"}], "return_token_id": True}
        )
    with pytest.raises(jsonschema.ValidationError):
        check(
            "vllm",
            "chat_completion_request",
            {
                "messages": [{"role": "user", "content": "x"}],
                "add_generation_prompt": True,
                "continue_final_message": True,
            },
        )


@pytest.mark.parametrize(("protocol", "body", "context"), CLIENT_REQUESTS[:2])
def test_sglang_generate_bodies_are_valid(protocol: Any, body: Any, context: Any) -> None:
    chat = protocol.normalize(body, context).engine_body
    check("sglang", "generate_request", sglang.generate_body(chat, [5, 6, 7]))


def test_the_recorded_sglang_answer_parses() -> None:
    recorded = json.loads((CONTRACTS / "sglang" / "generate_response_example.json").read_text())["body"]
    check("sglang", "generate_response", recorded)
    answer = sglang.as_chat_answer(recorded, list(range(recorded["meta_info"]["prompt_tokens"])), parse_tools=True)
    check("vllm", "chat_completion_response", {k: v for k, v in answer.items() if k != "weight_version"})
    assert EngineAnswer(answer).completion_token_ids == recorded["output_ids"]
    assert EngineAnswer(answer).logprobs == [t[0] for t in recorded["meta_info"]["output_token_logprobs"]]


def test_the_recorded_vllm_answer_parses() -> None:
    recorded = json.loads((CONTRACTS / "vllm" / "chat_completion_response_example.json").read_text())["body"]
    check("vllm", "chat_completion_response", recorded)
    answer = EngineAnswer(recorded)
    assert answer.completion_token_ids == recorded["choices"][0]["token_ids"]
    assert len(answer.logprobs) == recorded["usage"]["completion_tokens"] and answer.reasoning == "Think."


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    ports = {"vllm": free_port(), "sglang": free_port()}
    config = ["--policy-config", json.dumps(SAY)]
    specs = [
        engine_spec(ports["vllm"], "scripted", config, name="vllm"),
        engine_spec(ports["sglang"], "scripted", [*config, "--api", "sglang"], name="sglang"),
    ]
    with Stack(specs, {}, tmp_path_factory.mktemp("contract-engines")):
        yield {kind: f"http://127.0.0.1:{port}" for kind, port in ports.items()}


def _post(url: str, body: dict[str, Any], params: dict[str, str] | None = None) -> httpx.Response:
    return httpx.post(url, json=body, params=params, timeout=120)  # a hang guard, not a speed claim


def test_the_reference_engine_answers_as_vllm(engines: dict[str, str]) -> None:
    _answers_as_vllm(engines["vllm"])


def test_real_vllm_answers_as_its_contracts_say(real_vllm: SharedVllm) -> None:
    """The schemas were recorded from vLLM's source; the run's real vLLM server (0.32, CPU build) answers by them."""
    _answers_as_vllm(real_vllm.url, {"vllm_xargs": {"polar_route": "openai-chat-sdk"}})


def _answers_as_vllm(url: str, extra: dict[str, Any] | None = None) -> None:
    """Every answer Polar parses from a vLLM-protocol engine, checked against the vLLM schemas (the bodies sent
    are checked against the request schemas first)."""
    chat = {**capture_fields({"messages": [{"role": "user", "content": "q"}], "tools": TOOLS}), **(extra or {})}
    check("vllm", "chat_completion_request", chat)
    answer = _post(f"{url}/v1/chat/completions", chat).json()
    check("vllm", "chat_completion_response", answer)
    prompt = answer["prompt_token_ids"]
    completion_request = vllm_backend.completion_body(extra or {}, prompt)
    check("vllm", "completion_request", completion_request)
    completion = _post(f"{url}/v1/completions", completion_request).json()
    check("vllm", "completion_response", completion)
    check("vllm", "tokenize_response", _post(f"{url}/tokenize", {"prompt": "hi"}).json())
    check("vllm", "detokenize_response", _post(f"{url}/detokenize", {"tokens": prompt[:3]}).json())
    check("vllm", "error_response", _post(f"{url}/v1/chat/completions", {"messages": []}).json())
    check("vllm", "version_response", httpx.get(f"{url}/version", timeout=120).json())
    for reply in (
        _post(f"{url}/pause", {}, {"mode": "keep", "clear_cache": "false"}),
        httpx.get(f"{url}/is_paused", timeout=120),
        _post(f"{url}/resume", {}),
        _post(f"{url}/pause", {}, {"mode": "sideways"}),
    ):
        check("vllm", "pause_response", reply.json())
    _post(f"{url}/resume", {})


def test_the_reference_engine_answers_as_sglang(engines: dict[str, str]) -> None:
    tok = load_tokenizer()
    prompt = tok.encode(ChatTemplate().render(normalise_messages([{"role": "user", "content": "q"}]), TOOLS))
    body = sglang.generate_body({"messages": [], "tools": TOOLS}, prompt, uuid.uuid4().hex)
    check("sglang", "generate_request", body)
    answer = _post(f"{engines['sglang']}/generate", body).json()
    check("sglang", "generate_response", answer)
    parsed = sglang.as_chat_answer(answer, prompt, parse_tools=True)
    assert parsed["choices"][0]["finish_reason"] == "tool_calls" and parsed["prompt_token_ids"] == prompt


Check = Callable[[str, str, Any], None]
