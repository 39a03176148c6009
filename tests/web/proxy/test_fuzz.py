"""Property: whatever body a client throws at any proxy route of any protocol, the answer is never a 5xx.

Bodies are random JSON, near-valid requests built from every protocol's vocabulary, raw bytes, valid requests of
every protocol with one field (at any depth) replaced by a value of the wrong type, a lone UTF-16 surrogate (Node
CLIs cut strings mid-emoji), or deep nesting, and bodies nested thousands of levels deep. Every body goes to every
route, with and without a session key. The proxy runs in-process (Flask's test client) against a real reference
engine and Postgres, with a running session.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from polar.config import load_config
from polar.protocols import PROTOCOLS
from tests.live_proxy import live_proxy
from web.proxy import create_app

KEYS = [
    "model", "messages", "max_tokens", "stream", "tools", "tool_choice", "system", "stop", "stop_sequences",
    "temperature", "top_p", "contents", "systemInstruction", "generationConfig", "input", "instructions",
    "max_output_tokens", "role", "content", "type", "text", "parts", "functionCall", "functionResponse",
    "tool_calls", "tool_use_id", "thinking", "reasoning", "name", "arguments", "call_id", "output", "n",
    "stream_options", "include_usage", "input_schema", "parameters", "function", "id", "args", "response",
]  # fmt: skip

json_leaf = st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=False) | st.text(max_size=20)
json_value = st.recursive(
    json_leaf,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=8), inner, max_size=5)
    ),
    max_leaves=25,
)
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "system", "tool", "model", "developer", 3])},
    optional={"content": json_value, "parts": json_value, "tool_calls": json_value},
)
near_valid = st.fixed_dictionaries(
    {},
    optional={
        "model": st.sampled_from(["m", "", 5]),
        "messages": st.lists(message, max_size=3) | json_value,
        "contents": st.lists(message, max_size=3) | json_value,
        "input": st.text(max_size=10) | st.lists(message, max_size=3) | json_value,
        "max_tokens": st.integers(-5, 100_000) | json_value,
        "max_output_tokens": st.integers(-5, 100) | json_value,
        "stream": st.booleans() | json_value,
        "tools": json_value,
        "system": json_value,
        "generationConfig": json_value,
    },
)
# A valid request of each protocol, with the fields clients send (tools, tool calls and results, reasoning,
# streaming, structured output), for ``mutated`` to break one field at a time.
_FUNCTION = {
    "name": "calc",
    "description": "d",
    "parameters": {"type": "object", "properties": {"x": {"type": "string"}}},
}
VALID: list[dict[str, Any]] = [
    {"model": "m", "max_tokens": 8, "stream": True, "stream_options": {"include_usage": True}, "stop": ["x"],
     "tools": [{"type": "function", "function": _FUNCTION}],
     "tool_choice": {"type": "function", "function": {"name": "calc"}},
     "response_format": {"type": "json_object"}, "chat_template_kwargs": {"enable_thinking": False},
     "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]},
                  {"role": "assistant", "content": "a", "reasoning_content": "r", "tool_calls": [
                      {"id": "c1", "type": "function", "function": {"name": "calc", "arguments": '{"x": "1"}'}}]},
                  {"role": "tool", "tool_call_id": "c1", "content": "2"}]},
    {"model": "m", "instructions": "be brief", "max_output_tokens": 8, "stream": True, "store": False,
     "reasoning": {"effort": "low", "summary": "auto"}, "text": {"format": {"type": "json_schema", "name": "n",
                                                                             "schema": {"type": "object"}}},
     "tools": [{"type": "function", "name": "calc", "parameters": {"type": "object"}},
               {"type": "custom", "name": "patch", "format": {"type": "grammar", "syntax": "lark", "definition": "s"}},
               {"type": "namespace", "name": "ns", "tools": [{"type": "function", "name": "calc"}]},
               {"type": "web_search"}],
     "tool_choice": {"type": "allowed_tools", "mode": "required"},
     "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
               {"type": "reasoning", "summary": [{"type": "summary_text", "text": "t"}]},
               {"type": "function_call", "call_id": "c1", "name": "calc", "arguments": "{}"},
               {"type": "function_call_output", "call_id": "c1", "output": "2"},
               {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "a"}]}]},
    {"model": "m", "max_tokens": 8, "stream": True, "stop_sequences": ["x"], "top_k": 5, "metadata": {"user_id": "u"},
     "system": [{"type": "text", "text": "s", "cache_control": {"type": "ephemeral"}}],
     "thinking": {"type": "enabled", "budget_tokens": 1024}, "tool_choice": {"type": "tool", "name": "calc"},
     "tools": [{"name": "calc", "description": "d", "input_schema": {"type": "object"}}],
     "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]},
                  {"role": "assistant", "content": [{"type": "thinking", "thinking": "t", "signature": "s"},
                                                    {"type": "tool_use", "id": "t1", "name": "calc", "input": {}}]},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "2"}]}]},
    {"contents": [{"role": "user", "parts": [{"text": "hi"}]},
                  {"role": "model", "parts": [{"text": "t", "thought": True}, {"functionCall": {"name": "calc",
                                                                                              "args": {"x": "1"}}}]},
                  {"role": "user", "parts": [{"functionResponse": {"name": "calc", "response": {"result": "2"}}}]}],
     "systemInstruction": {"parts": [{"text": "s"}]},
     "tools": [{"functionDeclarations": [{"name": "calc", "parameters": {"type": "OBJECT"}}]}],
     "toolConfig": {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["calc"]}},
     "generationConfig": {"maxOutputTokens": 8, "stopSequences": ["x"], "responseMimeType": "application/json",
                          "thinkingConfig": {"thinkingBudget": 0, "includeThoughts": True}}},
]  # fmt: skip
lone_surrogates = st.text(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1, max_size=2)
cut_text = st.tuples(st.text(max_size=8), lone_surrogates, st.text(max_size=8)).map("".join)  # cut mid-emoji
deep = st.integers(100, 600).map(lambda n: json.loads("[" * n + "1" + "]" * n))  # past orjson's 255 levels
wrong = (
    st.sampled_from([[], {}, "", "x", 0, -1, 1.5, 2**70, True, None, [[]], [{}], ["x"], [3], {"x": []}, {"type": []}])
    | cut_text
    | st.text(max_size=4).map(lambda text: f"{text}\x00")  # Postgres text holds no NUL (a model name is text)
    | st.dictionaries(cut_text, st.just("v"), min_size=1, max_size=1)  # a lone surrogate in a key
    | deep
)


def _fields(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every path into ``value`` (the body itself included)."""
    yield path
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, child in items:
        yield from _fields(child, (*path, key))


def _replaced(body: dict[str, Any], path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    copy = json.loads(json.dumps(body))
    parent = copy
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = new
    return copy


mutated = st.sampled_from(VALID).flatmap(
    lambda body: st.builds(_replaced, st.just(body), st.sampled_from(list(_fields(body))), wrong)
)


def _encoded(value: Any) -> bytes:
    """JSON as a client sends it: surrogates escaped (``\\ud83d``), as JavaScript's JSON.stringify writes them."""
    return json.dumps(value).encode()


nested_bytes = st.tuples(st.integers(900, 100_000), st.sampled_from([(b"[", b"]"), (b'{"a":', b"}")])).map(
    lambda spec: spec[1][0] * spec[0] + b"1" + spec[1][1] * spec[0]
)
bodies = (
    json_value.map(_encoded)
    | near_valid.map(_encoded)
    | st.binary(max_size=64)
    | mutated.map(_encoded)
    | mutated.map(lambda v: json.dumps(v, ensure_ascii=False).encode("utf-8", "surrogatepass"))  # raw surrogates
    | nested_bytes
)


def _paths() -> list[tuple[str, str]]:
    paths = []
    for module in PROTOCOLS.values():
        for route in module.ROUTES:
            path = re.sub(r"\(\?P<\w+>[^)]*\)", "fuzz-model", route.pattern.pattern).replace("\\", "")
            paths.append((route.method, path))
    return sorted(set(paths))


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[tuple[Any, str]]:
    database_url = request.getfixturevalue("module_database_url")
    tmp: Path = tmp_path_factory.mktemp("fuzz")
    with live_proxy(database_url, tmp) as live:
        _session, key = live.session()
        config = load_config({"POLAR_DATABASE_URL": database_url, "POLAR_ENGINE_URLS": live.engine_url}, cwd=tmp)
        yield create_app(config).test_client(), key


@pytest.mark.parametrize(("method", "path"), _paths())
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=bodies)
def test_no_route_answers_5xx(proxy: tuple[Any, str], method: str, path: str, body: bytes) -> None:
    client, key = proxy
    for url in (f"/s/{key}{path}", path):
        response = client.open(url, method=method, data=body, headers={"content-type": "application/json"})
        response.get_data()  # drain streams too
        assert response.status_code < 500, (url, body, response.get_data()[:300])
