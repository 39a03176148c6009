"""Property: whatever body a client throws at any proxy route of any protocol, the answer is never a 5xx.

Bodies are random JSON, near-valid requests built from every protocol's vocabulary, and raw bytes. The proxy
runs in-process (Flask's test client) against a real reference engine and Postgres, with a running session.
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
from tests.support import live_proxy
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
bodies = (
    json_value.map(lambda v: json.dumps(v).encode())
    | near_valid.map(lambda v: json.dumps(v).encode())
    | st.binary(max_size=64)
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
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=bodies)
def test_no_route_answers_5xx(proxy: tuple[Any, str], method: str, path: str, body: bytes) -> None:
    client, key = proxy
    for url in (f"/s/{key}{path}", path):
        response = client.open(url, method=method, data=body, headers={"content-type": "application/json"})
        response.get_data()  # drain streams too
        assert response.status_code < 500, (url, body, response.get_data()[:300])
