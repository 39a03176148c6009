"""Bad input that real clients send gets a 400 in the caller's own protocol, never a 500 (AUDIT F16, F17): lone
UTF-16 surrogates (Node CLIs cut strings mid-emoji), wrong-typed fields, TITO conversations the engine refuses,
deep nesting on unknown routes; and a busy database pool is the capture-failure path (503), not a 500.

The proxy runs in-process (Flask's test client) against a real reference engine and Postgres, as in test_fuzz."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from polar.config import load_config
from polar.fleet.engines import EnginePool
from polar.protocols import detect
from polar.proxy import ProxyService
from polar.proxy.tito import ChainLink
from polar.proxy.tito_tails import TailRenders, prompt_ids
from polar.storage.database import Database
from tests.live_proxy import LiveProxy, live_proxy
from tests.processes import HANG_GUARD_S
from web.proxy import create_app

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}
# One generation route per protocol, a body it takes, and how to tell its error shape from the others'.
ROUTES = {
    "openai_chat": ("/v1/chat/completions", CHAT),
    "openai_responses": ("/v1/responses", {"model": "m", "input": "hi", "max_output_tokens": 16}),
    "anthropic": ("/v1/messages", {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}),
    "gemini": ("/v1beta/models/m:generateContent", {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}),
}


def error_shape(body: dict[str, Any]) -> str:
    """Which protocol's error body this is."""
    if body.get("type") == "error":
        return "anthropic"
    if "status" in body["error"]:
        return "gemini"
    return "openai"  # chat and Responses share OpenAI's error body


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory, module_database_url: str) -> Iterator[tuple[Any, LiveProxy]]:
    tmp: Path = tmp_path_factory.mktemp("bad-input")
    with live_proxy(module_database_url, tmp) as live:
        config = load_config({"POLAR_DATABASE_URL": module_database_url, "POLAR_ENGINE_URLS": live.engine_url}, cwd=tmp)
        yield create_app(config).test_client(), live


def post(client: Any, key: str, path: str, body: bytes | dict[str, Any]) -> Any:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return client.post(f"/s/{key}{path}", data=data, headers={"content-type": "application/json"})


@pytest.mark.parametrize("provider", sorted(ROUTES))
def test_a_lone_surrogate_is_a_400_in_the_callers_protocol(proxy: tuple[Any, LiveProxy], provider: str) -> None:
    client, live = proxy
    _, key = live.session()
    path, body = ROUTES[provider]
    cut = json.dumps(body).replace('"hi"', '"tool output cut mid-emoji \\ud83d"').encode()  # as a Node CLI sends
    refused = post(client, key, path, cut)
    assert refused.status_code == 400, refused.get_data()[:300]
    assert error_shape(refused.json) == {"openai_chat": "openai", "openai_responses": "openai"}.get(provider, provider)
    assert "lone UTF-16 surrogate" in json.dumps(refused.json)
    whole = json.dumps(body).replace('"hi"', '"an emoji \\ud83d\\ude00"').encode()  # a pair is one character
    assert post(client, key, path, whole).status_code == 200


@pytest.mark.parametrize("provider", sorted(ROUTES))
def test_a_model_or_agent_postgres_cannot_store_is_a_400(proxy: tuple[Any, LiveProxy], provider: str) -> None:
    """A NUL in the model name or the agent label (stored as text) failed only at the capture's insert, after the
    engine answered: a 503 "retry" that the harness retried forever."""
    client, live = proxy
    session_id, key = live.session()
    path, body = ROUTES[provider]
    named = ({**body, "model": "m\x00"}, path) if "model" in body else (body, path.replace("/m:", "/m%00:"))
    refused = post(client, key, named[1], named[0])
    assert refused.status_code == 400 and "model: must not contain a NUL" in json.dumps(refused.json), refused.json
    for agent_path, headers in ((f"/a/x%00y{path}", {}), (path, {"X-Polar-Agent": "x\x00y"})):
        answer = client.post(f"/s/{key}{agent_path}", data=json.dumps(body).encode(),
                             headers={"content-type": "application/json", **headers})  # fmt: skip
        assert answer.status_code == 400 and "agent" in json.dumps(answer.json), answer.json
    assert live.calls(session_id) == []  # refused before the engine was asked


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {**CHAT, "tool_choice": []}),
        ("/v1/chat/completions", {**CHAT, "tool_choice": {"type": "function", "function": "calc"}}),
        ("/v1/chat/completions", {**CHAT, "messages": [{"role": [], "content": "hi"}]}),
        ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": [{"type": {}, "text": "x"}]}]}),
        ("/v1/responses", {"model": "m", "input": "hi", "reasoning": {"effort": []}}),
        ("/v1/responses", {"model": "m", "input": "hi", "text": {"format": "x"}}),
        ("/v1/responses", {"model": "m", "input": [{"role": ["user"], "content": "hi"}]}),
        ("/v1/responses", {"model": "m", "input": [{"role": "user", "content": [{"type": [], "text": "x"}]}]}),
        ("/v1/responses", {"model": "m", "input": "hi", "tools": [{"type": {"x": 1}, "name": "f"}]}),
        ("/v1/responses", {"model": "m", "input": "hi", "tools": [{"type": "namespace", "tools": "abc"}]}),
        ("/v1/responses", {"model": "m", "input": [{"type": "reasoning", "summary": [{"text": ["t"]}]}]}),
        ("/v1/messages", {"model": "m", "max_tokens": 8, "messages": [{"role": "system"}]}),  # nothing to render
    ],
)
def test_a_wrong_typed_field_is_a_400(proxy: tuple[Any, LiveProxy], path: str, body: dict[str, Any]) -> None:
    client, live = proxy
    _, key = live.session()
    refused = post(client, key, path, body)
    assert refused.status_code == 400 and refused.json["error"]["type"] == "invalid_request_error", refused.json


def test_a_named_tool_choice_is_taken(proxy: tuple[Any, LiveProxy]) -> None:
    """OpenAI's ``{"type": "function", "function": {"name": ...}}`` was tested for membership in a set of strings:
    a TypeError, so every chat call naming its tool got a 500."""
    client, live = proxy
    _, key = live.session()
    tools = [{"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}]
    named = {**CHAT, "tools": tools, "tool_choice": {"type": "function", "function": {"name": "calc"}}}
    answered = post(client, key, "/v1/chat/completions", named)
    assert answered.status_code == 200, answered.json


@pytest.mark.parametrize("prefix", ["", "/s/pk-anything"])
def test_deep_nesting_on_an_unknown_route_is_a_404(proxy: tuple[Any, LiveProxy], prefix: str) -> None:
    client, _ = proxy
    deep = b"[" * 100_000 + b"]" * 100_000
    for path in ("/v1/nothing/here", "/v1/messages/nothing"):
        answer = client.post(prefix + path, data=deep, headers={"content-type": "application/json"})
        assert answer.status_code == 404, (path, answer.get_data()[:300])
    assert detect("POST", "/v1/nothing", {}, {}) is None  # the route is unknown by its path: the body decides


def test_a_tito_conversation_the_engine_refuses_gets_the_engines_400(proxy: tuple[Any, LiveProxy]) -> None:
    """The engine's /tokenize refuses a message the protocol passes through (here a non-string ``reasoning``; in
    the wild, a chat template's ``raise_exception``): the call is asked from its messages, and the client gets the
    engine's own 400, as without TITO, instead of a 500 from the TITO prompt builder."""
    client, live = proxy
    session_id, key = live.session(token_in_token_out=True)
    first = post(client, key, "/v1/chat/completions", CHAT)
    assert first.status_code == 200, first.json
    answer = first.json["choices"][0]["message"]
    messages = [*CHAT["messages"], {"role": "assistant", "content": answer["content"]},
                {"role": "user", "content": "and then?", "reasoning": 5}]  # fmt: skip
    refused = post(client, key, "/v1/chat/completions", {**CHAT, "messages": messages})
    assert refused.status_code == 400, refused.get_data()[:300]
    assert "reasoning" in refused.json["error"]["message"]
    assert [call["status_code"] for call in live.calls(session_id)] == [200, 400]  # captured, as without TITO


def test_a_tito_prompt_the_engine_cannot_decode_is_none(proxy: tuple[Any, LiveProxy]) -> None:
    """An end-of-turn id the engine will not decode (/detokenize answers 400): no TITO prompt, never a KeyError."""
    _, live = proxy
    pool = EnginePool([live.engine_url], timeout_s=HANG_GUARD_S)
    messages = [*CHAT["messages"], {"role": "assistant", "content": "OK."}, {"role": "user", "content": "more"}]
    prompt = live.prompt_ids({"messages": CHAT["messages"], "add_generation_prompt": True})
    link = ChainLink(uuid.uuid4(), prompt, [10**9], "stop", message_index=1)
    assert prompt_ids(pool, TailRenders(), uuid.uuid4(), None, link, {"messages": messages}, None) is None
    fine = ChainLink(uuid.uuid4(), prompt, [], "length", message_index=1)
    assert prompt_ids(pool, TailRenders(), uuid.uuid4(), None, fine, {"messages": messages}, None)


def test_a_busy_database_pool_is_the_capture_failure_path(proxy: tuple[Any, LiveProxy]) -> None:
    """Every pooled connection busy past the pool's wait raises ``sqlalchemy.exc.TimeoutError``, which is no
    ``DBAPIError``: it must become the capture-failure answer (503, retry, in the caller's protocol), not a 500."""
    _, live = proxy
    _, key = live.session()
    config = live.services.config
    db = Database(config.database_url, pool_size=1, max_overflow=0, pool_timeout_s=0.2)
    service = ProxyService(config, db, EnginePool([live.engine_url], timeout_s=HANG_GUARD_S))
    path, body = ROUTES["anthropic"]
    found = detect("POST", path, {}, {})
    assert found is not None
    raw = json.dumps(body).encode()
    assert service.handle(found, key, None, raw).status == 200  # the key is cached, the control state read
    try:
        with db.engine.connect() as held:  # the pool's one connection, busy
            held.execute(sa.text("SELECT 1"))
            answer = service.handle(found, key, None, raw)  # the engine answers; its capture cannot get a connection
        assert answer.status == 503 and answer.body is not None and error_shape(answer.body) == "anthropic"
        assert "busy" in answer.body["error"]["message"]
    finally:
        db.dispose()
