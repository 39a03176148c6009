"""The proxy under gunicorn in front of the reference engine, driven by the official ``openai`` SDK: key
handling (path, bearer, unknown, finished session), agent labels, and errors in OpenAI's shape."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import sqlalchemy as sa

from polar.config import load_config
from polar.local.launcher import free_port
from polar.proxy import ProxyService
from polar.proxy.key_misses import KeyMisses
from polar.storage.models import ModelCall, Session
from tests.live_proxy import LiveProxy, live_proxy, running_proxy_session
from tests.processes import HANG_GUARD_S
from tests.stage_calls import command_task
from web.proxy import create_app


@pytest.fixture
def proxy(database_url: str, tmp_path: Path) -> Iterator[LiveProxy]:
    with live_proxy(database_url, tmp_path) as live:
        yield live


def test_keys_agents_and_errors(proxy: LiveProxy) -> None:
    url, services = proxy.url, proxy.services
    session_id, key = proxy.session()

    client = openai.OpenAI(base_url=f"{url}/s/{key}/a/planner/v1", api_key="ignored", max_retries=0)
    reply = client.chat.completions.create(model="my-model", messages=[{"role": "user", "content": "hi"}])
    assert reply.model == "my-model" and reply.choices[0].message.content == "OK."

    bare = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)
    streamed = "".join(
        chunk.choices[0].delta.content or ""
        for chunk in bare.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], stream=True, extra_headers={"X-Polar-Agent": "w"}
        )
        if chunk.choices
    )
    assert streamed == "OK."
    assert [m.id for m in bare.models.list()] == ["polar-reference"]

    with services.db.unit() as db:
        calls = db.execute(sa.select(ModelCall.seq, ModelCall.agent, ModelCall.stream).order_by(ModelCall.seq)).all()
    assert [tuple(c) for c in calls] == [(1, "planner", False), (2, "w", True)]

    unknown = openai.OpenAI(base_url=f"{url}/s/pk-nope/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as caught:
        unknown.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert caught.value.status_code == 401 and "unknown proxy key" in str(caught.value)

    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model="m", messages=[])
    assert "messages" in str(bad.value)

    raw = httpx.post(
        f"{url}/s/{key}/v1/chat/completions",
        content=b"{oops",
        headers={"content-type": "application/json"},
        timeout=HANG_GUARD_S,
    )
    assert raw.status_code == 400 and raw.json()["error"]["type"] == "invalid_request_error"
    missing = httpx.post(f"{url}/v1/chat/completions", json={"model": "m", "messages": []}, timeout=HANG_GUARD_S)
    assert missing.status_code == 401 and "no proxy key" in missing.json()["error"]["message"]
    nowhere = httpx.get(f"{url}/s/{key}/v1/nothing", timeout=HANG_GUARD_S)
    assert nowhere.status_code == 404 and "error" in nowhere.json()

    with services.db.unit() as db:
        db.execute(sa.update(Session).where(Session.id == session_id).values(state="postrun"))
    with pytest.raises(openai.AuthenticationError) as ended:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "late"}])
    assert "no longer" in str(ended.value)
    with services.db.unit() as db:
        assert db.scalar(sa.select(sa.func.count()).select_from(ModelCall)) == 2


def test_sampling_overrides_and_a_dead_engine_first(database_url: str, tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    env = {"POLAR_SAMPLING_OVERRIDES": '{"temperature": 1.0, "top_p": 1.0}'}
    with live_proxy(database_url, tmp_path, env=env, engines_before=(dead,)) as proxy:
        for _ in range(4):  # whichever engine a session is pinned to, the dead one is skipped
            session_id, key = proxy.session()
            client = openai.OpenAI(base_url=f"{proxy.base(key)}/v1", api_key=key, max_retries=0)
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], temperature=0.2)
            (call,) = proxy.calls(session_id)
            assert call["normalized_request"]["temperature"] == 1.0 and call["request"]["temperature"] == 0.2


def test_unreachable_engine_is_a_502_in_openai_shape(database_url: str, tmp_path: Path) -> None:
    env = {"POLAR_ENGINE_URLS": f"http://127.0.0.1:{free_port()}"}
    with live_proxy(database_url, tmp_path, env=env) as proxy:
        session_id, key = proxy.session()
        client = openai.OpenAI(base_url=f"{proxy.base(key)}/v1", api_key=key, max_retries=0)
        with pytest.raises(openai.InternalServerError) as caught:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        assert caught.value.status_code == 502 and "no engine reachable" in str(caught.value)
        # Nothing was answered, but the failure is on record (postrun tells an engine outage from the policy's
        # own failure by it): the status the harness got, no tokens.
        (call,) = proxy.calls(session_id)
        assert (call["status_code"], call["prompt_token_ids"], call["completion_token_ids"]) == (502, [], [])
        assert "no engine reachable" in call["response"]["error"]["message"]


def test_unknown_routes_answer_in_the_callers_shape(proxy: LiveProxy) -> None:
    _session_id, key = proxy.session()
    gemini = httpx.post(f"{proxy.base(key)}/v1beta/models/m:embedContent", json={}, timeout=HANG_GUARD_S)
    assert gemini.status_code == 404 and gemini.json()["error"]["status"] == "NOT_FOUND"
    anthropic = httpx.post(
        f"{proxy.base(key)}/v1/messages/batches", json={}, headers={"anthropic-version": "x"}, timeout=HANG_GUARD_S
    )
    assert anthropic.status_code == 404 and anthropic.json()["type"] == "error"
    openai_style = httpx.get(f"{proxy.base(key)}/v1/files", timeout=HANG_GUARD_S)
    assert openai_style.status_code == 404 and openai_style.json()["error"]["type"] == "invalid_request_error"
    array = httpx.post(
        f"{proxy.base(key)}/v1beta/models/m:streamGenerateContent",
        json={"contents": [{"parts": [{"text": "hi"}]}]},
        timeout=HANG_GUARD_S,
    )
    assert array.status_code == 200 and array.headers["content-type"].startswith("application/json")
    assert isinstance(array.json(), list)


def test_oversized_bodies_get_413_in_each_protocols_shape(database_url: str, tmp_path: Path) -> None:
    with live_proxy(database_url, tmp_path, env={"POLAR_MAX_BODY_BYTES": "4096"}) as proxy:
        _session_id, key = proxy.session()
        big = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x" * 10_000}]}).encode()
        shapes = {
            "/v1/chat/completions": lambda body: body["error"]["type"] == "invalid_request_error",
            "/v1/responses": lambda body: body["error"]["type"] == "invalid_request_error",
            "/v1/messages": lambda body: body["type"] == "error" and body["error"]["type"] == "request_too_large",
            "/v1beta/models/m:generateContent": lambda body: body["error"]["code"] == 413,
        }
        for path, shaped in shapes.items():
            response = httpx.post(
                f"{proxy.base(key)}{path}",
                content=big,
                headers={"content-type": "application/json"},
                timeout=HANG_GUARD_S,
            )
            assert response.status_code == 413, path
            assert shaped(response.json()), (path, response.json())
        assert proxy.calls(_session_id) == []


# ~300 tokens of answer at 2 tokens/s: a call generates far longer than the proxy's 1 s engine timeout (20 tokens).
LONG_ANSWER = json.dumps({"turns": [{"content": " ".join(["word"] * 300)}]})


def test_a_timed_out_call_is_stored_with_why_and_every_call_asks_at_most_the_cap(
    database_url: str, tmp_path: Path
) -> None:
    """A 504 on a healthy engine with nothing waiting was generating the call (``generation_timeout``, the policy's
    doing); one whose request waited for a slot is the engine's (``engine_timeout``). Either way the harness gets
    its 504, and every call asked at most ``POLAR_MAX_NEW_TOKENS``: by default what the engine decodes within the
    engine timeout at ``POLAR_MIN_DECODE_RATE`` (1 s at 20 tokens/s here), also when it asked none."""
    env, slow = {"POLAR_ENGINE_TIMEOUT": "1"}, ("--decode-rate", "2")
    with live_proxy(database_url, tmp_path, policy_config=LONG_ANSWER, env=env, engine_args=slow) as proxy:
        generating, generating_key = proxy.session()
        client = openai.OpenAI(base_url=f"{proxy.base(generating_key)}/v1", api_key=generating_key, max_retries=0)
        with pytest.raises(openai.APIStatusError) as timed_out:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "talk"}])
        assert timed_out.value.status_code == 504 and "still generating" in str(timed_out.value)

        queued, queued_key = proxy.session()
        paused = httpx.post(f"{proxy.engine_url}/pause", params={"mode": "keep"}, timeout=HANG_GUARD_S)
        assert paused.status_code == 200  # a new request waits for a slot, counted as waiting
        try:
            client = openai.OpenAI(base_url=f"{proxy.base(queued_key)}/v1", api_key=queued_key, max_retries=0)
            with pytest.raises(openai.APIStatusError) as waited:
                client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "talk"}], max_tokens=30_000
                )
            assert waited.value.status_code == 504
        finally:
            httpx.post(f"{proxy.engine_url}/resume", timeout=HANG_GUARD_S)

        with proxy.services.db.unit() as db:
            rows = db.execute(sa.select(ModelCall.session_id, ModelCall.status_code, ModelCall.failure_kind)).all()
        assert sorted(tuple(row)[1:] for row in rows) == [(504, "engine_timeout"), (504, "generation_timeout")]
        assert {row.session_id: row.failure_kind for row in rows} == {
            generating: "generation_timeout",
            queued: "engine_timeout",
        }
        (asked_none,), (asked_more,) = proxy.calls(generating), proxy.calls(queued)
        for call in (asked_none, asked_more):
            assert call["normalized_request"]["max_tokens"] == 20 and call["sampling"]["used"]["max_tokens"] == 20
        assert "max_tokens" not in asked_none["sampling"]["requested"]
        assert asked_more["sampling"]["requested"]["max_tokens"] == 30_000


def test_unknown_keys_spend_the_budget_of_the_address_they_come_from(database_url: str, tmp_path: Path) -> None:
    """Audit G4: the proxy budgets lookups of unknown keys by the request's peer address (``REMOTE_ADDR``), so a
    flood from one sandbox's address holds no other address's first calls. In-process (Flask's test client)."""
    config = load_config({"POLAR_DATABASE_URL": database_url, "POLAR_ENGINE_URLS": "http://127.0.0.1:1",
                          "POLAR_SERVED_MODEL": "m"}, cwd=tmp_path)  # fmt: skip
    app = create_app(config)
    service: ProxyService = app.extensions["polar_proxy"]
    service.admission._misses = KeyMisses(rate_per_s=0.001, burst=5)  # refilled too slowly to matter here
    client = app.test_client()

    def models(key: str, address: str) -> int:
        return client.get(f"/s/{key}/v1/models", environ_base={"REMOTE_ADDR": address}).status_code

    try:
        flood = [models(f"pk-made-up-{n}", "10.0.0.66") for n in range(20)]
        assert flood.count(401) == 5 and flood.count(429) == 15
        _, key = running_proxy_session(database_url, tmp_path, command_task("t", "true"))
        assert models(key, "10.0.0.66") == 429
        assert models(key, "10.0.0.7") == 200
    finally:
        service.engines.close()
        service.db.dispose()
