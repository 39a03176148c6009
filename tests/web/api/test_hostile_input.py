"""Input that is JSON, or HTTP, but that the API used to answer with a 500 or to accept against its own description
(found fuzzing it with schemathesis, ``tests/e2e/test_openapi.py``, and by reading the paths it took): each is now
a 4xx that says what is wrong, and writes nothing."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask
from flask.testing import FlaskClient

from polar.config import load_config
from tests.stage_calls import command_task
from web.api import create_app

ADMIN = "hostile-admin-" + "a" * 30
READ = "hostile-reader-" + "b" * 30


@pytest.fixture(scope="module")
def app(module_database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Flask]:
    env = {
        "POLAR_DATABASE_URL": module_database_url, "POLAR_BROKER_URL": "memory://", "POLAR_READY_BUFFER": "0",
        "POLAR_API_TOKEN": ADMIN, "POLAR_API_READ_TOKEN": READ,
    }  # fmt: skip
    app = create_app(load_config(env, cwd=tmp_path_factory.mktemp("hostile")))
    yield app
    app.extensions["polar"].db.dispose()


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    client = app.test_client()
    client.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {ADMIN}"
    return client


def batches(app: Flask) -> int:
    with app.extensions["polar"].db.engine.connect() as connection:
        return int(connection.execute(sa.text("SELECT count(*) FROM batches")).scalar_one())


def task(**extra: Any) -> dict[str, Any]:
    return command_task("t", "true", **extra)


def nested(depth: int) -> list[Any]:
    """``[[[...]]]``, ``depth`` lists deep: more than a stored body may nest (polar.codec.json_body.MAX_DEPTH)."""
    value: list[Any] = []
    for _ in range(depth - 1):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"tasks": [task(instruction="a\x00b")]}, "tasks[0].instruction"),  # Postgres text holds no NUL
        ({"name": "n\x00", "tasks": [task()]}, "name"),
        ({"tasks": [task(metadata={"k\x00": 1})]}, "tasks[0].metadata"),  # nor does jsonb, in keys either
        ('{"tasks": [{"task_id": "t", "instruction": "x", "harness": {"name": "command", "command": "true"}, '
         '"metadata": {"big": 1e999}}]}', "tasks[0].metadata.big"),  # decodes to infinity, which JSON cannot hold
        ('{"tasks": [{"task_id": "t", "instruction": "\\ud800", "harness": {"name": "command", "command": "true"}}]}',
         "tasks[0].instruction"),  # a lone surrogate: not UTF-8, so not storable
        ({"tasks": [task()], "defaults": {"metadata": {"x": nested(120)}}}, "defaults.metadata.x" + "[0]" * 98),
    ],
)  # fmt: skip
def test_bodies_the_database_cannot_store_are_a_400(app: Flask, client: FlaskClient, body: Any, field: str) -> None:
    before = batches(app)
    if isinstance(body, str):
        response = client.post("/v1/batches", data=body, content_type="application/json")
    else:
        response = client.post("/v1/batches", json=body)
    assert response.status_code == 400, response.json
    assert response.json["error"]["field"] == field
    assert batches(app) == before


def test_a_body_nested_past_the_parser_is_a_400(client: FlaskClient) -> None:
    response = client.post("/v1/batches", data="[" * 100_000, content_type="application/json")
    assert response.status_code == 400 and "nested too deeply" in response.json["error"]["message"]


def test_an_empty_idempotency_key_is_refused_not_ignored(app: Flask, client: FlaskClient) -> None:
    before = batches(app)
    response = client.post("/v1/batches", json={"tasks": [task()]}, headers={"Idempotency-Key": ""})
    assert response.status_code == 400 and response.json["error"]["field"] == "Idempotency-Key"
    assert batches(app) == before


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/engine/pause", {"policy_version": True}, "policy_version"),  # a bool is no version
        ("/v1/engine/pause", {"mode": "sometimes"}, "mode"),
        ("/v1/engine/resume", {"mode": "wait"}, "mode"),  # resuming has no mode
        ("/v1/engine/resume", {"policy_version": "v\x00"}, "policy_version"),
    ],
)
def test_engine_bodies_follow_their_models(client: FlaskClient, path: str, body: Any, field: str) -> None:
    response = client.post(path, json=body)
    assert response.status_code == 400 and response.json["error"]["field"] == field, response.json
    assert client.get("/v1/engine").json["paused"] is False


def test_the_read_token_on_a_path_with_a_nul_is_a_403(app: Flask) -> None:
    # The refusal is audited with the path; a NUL in it must not turn the 403 into a 500.
    response = app.test_client().post("/v1/batches/%00/cancel", headers={"Authorization": f"Bearer {READ}"})
    assert response.status_code == 403


@pytest.mark.parametrize(
    ("path", "status", "field"),
    [
        ("/v1/trajectories?limit=5&limit=x", 400, "limit"),  # given twice: which one was meant?
        ("/v1/trajectories?wait=0&wait=0", 400, "wait"),
        ("/v1/trajectories?batch_id=", 404, None),  # an empty batch id is no batch, not "every batch"
        ("/v1/trajectories?batch_id=6ba7b8109dad11d180b400c04fd430c8", 404, None),  # bare hex is no id we hand out
        ("/v1/batches/{6ba7b810-9dad-11d1-80b4-00c04fd430c8}", 404, None),
        ("/v1/batches/urn:uuid:6ba7b810-9dad-11d1-80b4-00c04fd430c8/sessions", 404, None),
        ("/v1/batches/6ba7b810-9dad-11d1-80b4-00c04fd430c8/export?min_reward=", 400, "min_reward"),
        ("/v1/batches/6ba7b810-9dad-11d1-80b4-00c04fd430c8/export?kind=rl&kind=sft", 400, "kind"),
    ],
)
def test_query_and_path_values_are_read_strictly(client: FlaskClient, path: str, status: int, field: str) -> None:
    response = client.get(path)
    assert response.status_code == status, response.json
    assert response.json["error"].get("field") == field


def test_an_id_in_capitals_is_still_the_id(app: Flask, client: FlaskClient) -> None:
    batch_id = client.post("/v1/batches", json={"tasks": [task()]}).json["batch_id"]
    assert client.get(f"/v1/batches/{batch_id.upper()}").json["batch_id"] == batch_id


@pytest.mark.parametrize(
    "path", ["/v1/batches//sessions?limit=5", "/v1/batches//export", "/v1/sessions//calls", "/v1//engines"]
)
def test_an_empty_id_is_not_found_not_redirected(client: FlaskClient, path: str) -> None:
    """Werkzeug merges ``//`` and redirects (308) to whatever route the shorter path matches (``/v1/batches/
    sessions`` would be the batch named "sessions"); schemathesis' CLI found it, an empty id being schema-invalid."""
    response = client.get(path)
    assert response.status_code == 404 and "Location" not in response.headers
