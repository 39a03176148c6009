"""``GET /metrics`` on the API: behind a token like every route (the read-only one suffices) unless
``POLAR_METRICS_PUBLIC`` opens it; it shows the API's own requests and the deployment's state, and parses."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from flask import Flask

from polar.config import load_config
from tests.prometheus import parse
from web.api import create_app
from web.api.metrics import stage_queue_names

ADMIN = "admin-" + "a" * 30
READ = "reader-" + "b" * 30


def make_app(database_url: str, broker_url: str, tmp_path: Path, **env: str) -> Flask:
    base = {"POLAR_DATABASE_URL": database_url, "POLAR_BROKER_URL": broker_url, "POLAR_API_TOKEN": ADMIN,
            "POLAR_API_READ_TOKEN": READ}  # fmt: skip
    return create_app(load_config({**base, **env}, cwd=tmp_path))


@pytest.fixture
def app(database_url: str, broker_url: str, tmp_path: Path) -> Iterator[Flask]:
    app = make_app(database_url, broker_url, tmp_path)
    yield app
    app.extensions["polar"].db.dispose()


def test_metrics_take_a_token_and_show_requests_and_the_deployment(app: Flask) -> None:
    client = app.test_client()
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.get("/healthz").status_code == 200
    response = client.get("/metrics", headers={"Authorization": f"Bearer {READ}"})
    assert response.status_code == 200
    assert response.content_type.startswith("text/plain; version=0.0.4")
    found = parse(response.get_data(as_text=True))
    assert found.value("polar_api_requests_total", endpoint="metrics.prometheus", method="GET", status="401") == 2
    assert found.value("polar_api_requests_total", endpoint="health.healthz", status="200") == 1
    assert found.value("polar_api_request_duration_seconds_count", endpoint="health.healthz") == 1
    assert found.value("polar_database_up") == 1 and found.value("polar_broker_up") == 1
    assert found.value("polar_sessions", state="pending") == 0
    assert found.value("polar_queue_messages", queue="run") == 0
    assert {name for name in found.families if not name.startswith("polar_")} == set()


def test_metrics_public_opens_metrics_and_nothing_else(database_url: str, broker_url: str, tmp_path: Path) -> None:
    app = make_app(database_url, broker_url, tmp_path, POLAR_METRICS_PUBLIC="true")
    try:
        client = app.test_client()
        assert client.get("/metrics").status_code == 200
        assert client.get("/v1/batches/00000000-0000-0000-0000-000000000000").status_code == 401
    finally:
        app.extensions["polar"].db.dispose()


def test_the_queues_measured_are_the_shared_ones_and_each_nodes_pinned_ones() -> None:
    assert stage_queue_names(["a", "b"]) == [
        "init", "ready", "run", "postrun", "ready.a", "run.a", "postrun.a", "ready.b", "run.b", "postrun.b",
    ]  # fmt: skip
