"""The feed's parameters, and pause/resume as a live proxy sees them through the official ``openai`` SDK."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import openai
import pytest
from flask.testing import FlaskClient

from polar.config import load_config
from tests.live_proxy import live_proxy
from web.api import create_app

TOKEN = "test-admin-token-" + "0" * 24


def api(database_url: str, broker_url: str, tmp_path: Path) -> FlaskClient:
    env = {"POLAR_DATABASE_URL": database_url, "POLAR_BROKER_URL": broker_url, "POLAR_API_TOKEN": TOKEN}
    client = create_app(load_config(env, cwd=tmp_path)).test_client()
    client.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {TOKEN}"
    return client


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("wait=soon", "wait"),
        ("wait=600", "wait"),
        ("after=-1", "after"),
        ("limit=0", "limit"),
        ("groups=maybe", "groups"),
        ("groups=true&informative=perhaps", "informative"),
    ],
)
def test_feed_parameters_are_checked(
    database_url: str, broker_url: str, tmp_path: Path, query: str, field: str
) -> None:
    response = api(database_url, broker_url, tmp_path).get(f"/v1/trajectories?{query}")
    assert response.status_code == 400 and response.json["error"]["field"] == field


def test_feed_long_poll_times_out_empty(database_url: str, broker_url: str, tmp_path: Path) -> None:
    client = api(database_url, broker_url, tmp_path)
    started = time.monotonic()
    response = client.get("/v1/trajectories?wait=0.6")
    assert response.status_code == 200 and response.json == {"items": [], "next_cursor": 0}
    assert time.monotonic() - started >= 0.6
    assert client.get("/v1/trajectories?batch_id=nope").status_code == 404
    for query in ("groups=true&informative=true", "informative=true"):  # it serves whole groups either way
        grouped = client.get(f"/v1/trajectories?{query}")
        assert grouped.json == {"items": [], "next_cursor": 0, "skipped_uninformative": 0}


def test_pause_and_resume_through_the_proxy(database_url: str, broker_url: str, tmp_path: Path) -> None:
    client = api(database_url, broker_url, tmp_path)
    assert client.post("/v1/engine/pause", json={"mode": "sometimes"}).status_code == 400
    assert client.post("/v1/engine/pause", json={"colour": 1}).status_code == 400
    with live_proxy(database_url, tmp_path) as proxy:
        session_id, key = proxy.session()
        sdk = openai.OpenAI(base_url=f"{proxy.base(key)}/v1", api_key=key, max_retries=0)
        ask = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}

        assert client.post("/v1/engine/resume", json={"policy_version": "v1"}).json["policy_version"] == "v1"
        time.sleep(0.6)
        sdk.chat.completions.create(**ask)

        paused = client.post("/v1/engine/pause", json={"policy_version": "v2"}).json
        engines = paused.pop("engines")  # the API's POLAR_ENGINE_URLS (the default) has no engine listening
        assert paused == {"paused": True, "mode": "reject", "policy_version": "v2"}
        assert [(e["ok"], e["kind"]) for e in engines] == [(False, "vllm")] and "ConnectError" in engines[0]["error"]
        with pytest.raises(openai.RateLimitError) as caught:
            sdk.chat.completions.create(**ask)
        assert caught.value.response.headers["retry-after"] == "2"

        client.post("/v1/engine/pause", json={"mode": "wait"})
        threading.Timer(1.0, lambda: client.post("/v1/engine/resume", json={"policy_version": "v3"})).start()
        started = time.monotonic()
        sdk.chat.completions.create(**ask)  # held until the resume
        assert time.monotonic() - started >= 0.8
        assert client.get("/v1/engine").json == {"paused": False, "mode": "reject", "policy_version": "v3"}

        versions = [call["policy_version"] for call in proxy.calls(session_id)]
        assert versions == ["v1", "v3"]  # the rejected call was never made, so never stored
