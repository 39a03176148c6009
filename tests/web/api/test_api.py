"""The rollout API on a real Postgres: strict validation, auth, idempotency, paging, 404s.

Bad input must get a 4xx naming the problem and write nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from flask.testing import FlaskClient

from polar.config import load_config
from tests.stage_calls import command_task
from web.api import create_app

TABLES = ("batches", "tasks", "sessions", "session_events")
TOKEN = "test-admin-token-" + "0" * 24


@pytest.fixture
def make_client(database_url: str, broker_url: str, tmp_path: Path) -> Iterator[Any]:
    engines: list[sa.Engine] = []

    def make(**env: str) -> FlaskClient:
        base = {"POLAR_DATABASE_URL": database_url, "POLAR_BROKER_URL": broker_url, "POLAR_READY_BUFFER": "0"}
        config = load_config({**base, "POLAR_API_TOKEN": TOKEN, **env}, cwd=tmp_path)
        app = create_app(config)
        engines.append(app.extensions["polar"].db.engine)
        client = app.test_client()
        client.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {config.api_token}"  # every request, unless a test
        return client

    yield make
    for engine in engines:
        engine.dispose()


@pytest.fixture
def client(make_client: Any) -> FlaskClient:
    return make_client()


def row_counts(client: FlaskClient) -> dict[str, int]:
    engine = client.application.extensions["polar"].db.engine
    with engine.connect() as connection:
        return {t: connection.execute(sa.text(f"SELECT count(*) FROM {t}")).scalar_one() for t in TABLES}


@pytest.mark.parametrize(
    ("data", "content_type", "words"),
    [
        ("{not json", "application/json", "not valid JSON"),
        ('{"tasks": [}', "application/json", "not valid JSON"),
        ('{"tasks": [{"task_id": "a", "instruction": "x", "harness": {"name": "command", "command": "true"}, '
         '"metadata": {"score": NaN}}]}', "application/json", "NaN is not a JSON value"),
        ('{"tasks": []}', "text/plain", "must be JSON"),
        ("[1, 2]", "application/json", "JSON object"),
        ('{"tasks": [{"task_id": "a"}]}', "application/json", "tasks[0].instruction"),
        ('{"tasks": [{"task_id": "a", "instruction": "x", "harness": {"name": "command", "command": "true"}, '
         '"colour": 1}]}', "application/json", "tasks[0].colour: unknown field"),
        ('{"tasks": [{"task_id": "a", "instruction": "x", "harness": {"name": "command", "command": "true"}, '
         '"num_samples": "many"}]}', "application/json", "tasks[0].num_samples"),
        ('{"tasks": [{"task_id": "a", "instruction": "x", "harness": {"name": "emacs"}}]}', "application/json",
         "tasks[0].harness.name"),
        ('{"tasks": [{"task_id": "a", "instruction": "x", "harness": {"name": "command", "command": "true"}, '
         '"evaluator": {"name": "no_such"}}]}', "application/json", "tasks[0].evaluator.name"),
        ('{"tasks": [{"task_id": "a", "instruction": "x", "harness": {"name": "command", "command": "true"}, '
         '"runtime": {"backend": "docker", "image": "polar-no-such-image:0"}}]}', "application/json",
         "tasks[0].runtime.backend"),
    ],
)  # fmt: skip
def test_bad_batches_are_rejected_and_write_nothing(
    client: FlaskClient, data: str, content_type: str, words: str
) -> None:
    before = row_counts(client)
    response = client.post("/v1/batches", data=data, content_type=content_type)
    assert response.status_code == 400
    assert words in response.json["error"]["message"]
    assert row_counts(client) == before


def test_submit_and_read_back(client: FlaskClient) -> None:
    response = client.post("/v1/batches", json={"name": "b", "tasks": [command_task("a", "true", samples=3)]})
    assert response.status_code == 201
    batch_id = response.json["batch_id"]
    assert response.json["num_sessions"] == 3
    batch = client.get(f"/v1/batches/{batch_id}").json
    assert batch["status"] == "pending" and batch["counts"] == {"pending": 3} and batch["name"] == "b"
    page = client.get(f"/v1/batches/{batch_id}/sessions?limit=2").json
    assert [s["sample_index"] for s in page["items"]] == [0, 1] and page["next_offset"] == 2
    rest = client.get(f"/v1/batches/{batch_id}/sessions?limit=2&offset=2").json
    assert [s["sample_index"] for s in rest["items"]] == [2] and rest["next_offset"] is None
    keyset = client.get(f"/v1/batches/{batch_id}/sessions?limit=2&after={page['next_after']}").json
    assert [s["sample_index"] for s in keyset["items"]] == [2] and keyset["next_after"] is None
    session_id = page["items"][0]["session_id"]
    session = client.get(f"/v1/sessions/{session_id}").json
    assert session["state"] == "pending" and session["task_id"] == "a"
    assert client.get(f"/v1/sessions/{session_id}/calls").json == {"items": [], "next_after": None}
    assert client.get(f"/v1/sessions/{session_id}/trajectories").json == {"items": []}


@pytest.mark.parametrize(
    "path",
    [
        "/v1/batches/00000000-0000-0000-0000-000000000000",
        "/v1/batches/not-a-uuid",
        "/v1/batches/00000000-0000-0000-0000-000000000000/sessions",
        "/v1/sessions/00000000-0000-0000-0000-000000000000",
        "/v1/sessions/00000000-0000-0000-0000-000000000000/calls",
        "/v1/sessions/nope/trajectories",
        "/v1/nothing-here",
    ],
)
def test_unknown_ids_are_404(client: FlaskClient, path: str) -> None:
    response = client.get(path)
    assert response.status_code == 404
    assert response.json["error"]["message"]


def test_bad_paging_is_400(client: FlaskClient) -> None:
    batch_id = client.post("/v1/batches", json={"tasks": [command_task("a", "true")]}).json["batch_id"]
    response = client.get(f"/v1/batches/{batch_id}/sessions?limit=zero")
    assert response.status_code == 400 and response.json["error"]["field"] == "limit"
    for cursor in ("1.2", "0.0.x", "43929059336811134542.5470.444", "\u00b2.0.0"):
        response = client.get(f"/v1/batches/{batch_id}/sessions", query_string={"after": cursor})
        assert response.status_code == 400 and response.json["error"]["field"] == "after", cursor


def test_idempotency_key_replays_and_conflicts(client: FlaskClient) -> None:
    body = {"tasks": [command_task("a", "true", samples=2)]}
    first = client.post("/v1/batches", json=body, headers={"Idempotency-Key": "k1"})
    again = client.post("/v1/batches", json=body, headers={"Idempotency-Key": "k1"})
    assert first.status_code == 201 and again.status_code == 200
    assert first.json == again.json
    other = client.post("/v1/batches", json={"tasks": [command_task("b", "true")]}, headers={"Idempotency-Key": "k1"})
    assert other.status_code == 409 and "Idempotency-Key" in other.json["error"]["message"]
    assert row_counts(client)["sessions"] == 2


def test_bearer_token_required(make_client: Any) -> None:
    client = make_client()
    del client.environ_base["HTTP_AUTHORIZATION"]
    assert client.get("/healthz").status_code == 200
    denied = client.post("/v1/batches", json={"tasks": [command_task("a", "true")]})
    assert denied.status_code == 401 and "bearer token" in denied.json["error"]["message"]
    assert client.get("/v1/batches/x", headers={"Authorization": "Bearer wrong"}).status_code == 401
    ok = client.post(
        "/v1/batches", json={"tasks": [command_task("a", "true")]}, headers={"Authorization": f"Bearer {TOKEN}"}
    )
    assert ok.status_code == 201
