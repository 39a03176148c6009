"""``GET /metrics`` on the proxy: open (aggregates only, like the engines' own), every answer counted, the
engines' in-flight gauges shown from the start; the path stays free of any session's routes."""

from __future__ import annotations

from pathlib import Path

from polar.config import load_config
from tests.prometheus import parse
from web.proxy import create_app


def test_the_proxy_serves_its_metrics_without_a_key(database_url: str, tmp_path: Path) -> None:
    env = {"POLAR_DATABASE_URL": database_url, "POLAR_ENGINE_URLS": "http://127.0.0.1:1,http://127.0.0.1:2"}
    app = create_app(load_config(env, cwd=tmp_path))
    client = app.test_client()
    assert client.get("/v1/nothing-here").status_code == 404
    assert client.post("/v1/chat/completions", json={"model": "m", "messages": []}).status_code == 401
    # A base URL configured with a trailing slash doubles it: still the session's route (Flask's routing made it a 404).
    assert client.post("/s/pk-x//v1/chat/completions", json={"model": "m", "messages": []}).status_code == 401
    response = client.get("/metrics")
    assert response.status_code == 200
    found = parse(response.get_data(as_text=True))
    assert found.value("polar_proxy_requests_total", operation="unknown", status="404") == 1
    assert found.value("polar_proxy_requests_total", protocol="openai_chat", operation="generate", status="401") == 2
    assert found.labels("polar_engine_inflight_calls", "engine") == {"http://127.0.0.1:1", "http://127.0.0.1:2"}
    # Under a session's base URL, /metrics is a model-API path like any other: not the proxy's metrics.
    assert client.get("/s/pk-x/metrics").status_code == 404
    app.extensions["polar_proxy"].db.dispose()


def test_a_bug_answers_in_the_callers_error_shape(database_url: str, tmp_path: Path) -> None:
    """Model calls skip Flask's error handlers (``ProxyApp.wsgi_app``): an exception inside still gets a 500 in
    the caller's protocol, counted, never an HTML page; a method no protocol has gets a 405 the same way."""
    env = {"POLAR_DATABASE_URL": database_url, "POLAR_ENGINE_URLS": "http://127.0.0.1:1"}
    app = create_app(load_config(env, cwd=tmp_path))
    client = app.test_client()

    def broken(*args: object) -> None:
        raise RuntimeError("a bug")

    app.extensions["polar_proxy"].handle = broken
    answer = client.post("/s/pk-x/v1/messages", json={"model": "m", "max_tokens": 8, "messages": []},
                         headers={"anthropic-version": "2023-06-01"})  # fmt: skip
    assert answer.status_code == 500 and answer.json["type"] == "error"
    assert answer.json["error"]["message"] == "internal proxy error: RuntimeError"
    refused = client.put("/s/pk-x/v1/chat/completions", json={})
    assert refused.status_code == 405 and "PUT" in refused.json["error"]["message"]
    found = parse(client.get("/metrics").get_data(as_text=True))
    assert found.value("polar_proxy_requests_total", protocol="anthropic", operation="unknown", status="500") == 1
    app.extensions["polar_proxy"].db.dispose()
