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
    response = client.get("/metrics")
    assert response.status_code == 200
    found = parse(response.get_data(as_text=True))
    assert found.value("polar_proxy_requests_total", operation="unknown", status="404") == 1
    assert found.value("polar_proxy_requests_total", protocol="openai_chat", operation="generate", status="401") == 1
    assert found.labels("polar_engine_inflight_calls", "engine") == {"http://127.0.0.1:1", "http://127.0.0.1:2"}
    # Under a session's base URL, /metrics is a model-API path like any other: not the proxy's metrics.
    assert client.get("/s/pk-x/metrics").status_code == 404
    app.extensions["polar_proxy"].db.dispose()
