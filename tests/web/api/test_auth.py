"""The API never runs open: no token, no API; the admin token does everything, the read-only token reads and gets
403 on every route that starts or changes work; submissions, cancels, pauses, resumes and exports leave audit rows.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask

from polar.config import load_config
from polar.errors import ValidationError
from polar.local.launcher import Stack, free_port, gunicorn_spec
from tests.stage_calls import command_task
from web.api import create_app
from web.api.auth import SELF_AUTHENTICATING

ADMIN = "admin-" + "a" * 30
READ = "reader-" + "b" * 30
SAFE = {"GET", "HEAD", "OPTIONS"}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def fingerprint(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()[:8]


def make_app(database_url: str, broker_url: str, tmp_path: Path, **env: str) -> Flask:
    base = {"POLAR_DATABASE_URL": database_url, "POLAR_BROKER_URL": broker_url, "POLAR_READY_BUFFER": "0"}
    return create_app(load_config({**base, **env}, cwd=tmp_path))


@pytest.fixture
def app(database_url: str, broker_url: str, tmp_path: Path) -> Iterator[Flask]:
    app = make_app(database_url, broker_url, tmp_path, POLAR_API_TOKEN=ADMIN, POLAR_API_READ_TOKEN=READ)
    yield app
    app.extensions["polar"].db.dispose()


def sql(app: Flask, query: str, **params: Any) -> list[Any]:
    with app.extensions["polar"].db.engine.connect() as connection:
        return list(connection.execute(sa.text(query), params).all())


def submit(app: Flask, *tasks: dict[str, Any], token: str = ADMIN, **headers: str) -> Any:
    body = {"name": "audited", "tasks": list(tasks or [command_task("a", "true", samples=2)])}
    return app.test_client().post("/v1/batches", json=body, headers={**bearer(token), **headers})


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ({}, "POLAR_API_TOKEN is not set"),
        ({"POLAR_API_TOKEN": "   "}, "POLAR_API_TOKEN is not set"),
        ({"POLAR_API_TOKEN": "short"}, "at least 32 characters"),
        ({"POLAR_API_TOKEN": ADMIN, "POLAR_API_READ_TOKEN": "short"}, "POLAR_API_READ_TOKEN"),
        ({"POLAR_API_TOKEN": ADMIN, "POLAR_API_READ_TOKEN": ADMIN}, "must differ"),
    ],
)
def test_the_app_refuses_to_start_without_a_proper_token(
    database_url: str, broker_url: str, tmp_path: Path, env: dict[str, str], words: str
) -> None:
    with pytest.raises(ValidationError) as refused:
        make_app(database_url, broker_url, tmp_path, **env)
    assert words in str(refused.value)
    assert "python -c 'import secrets; print(secrets.token_urlsafe(32))'" in str(refused.value)


def test_gunicorn_without_a_token_exits_and_says_why(database_url: str, tmp_path: Path) -> None:
    env = {"POLAR_DATABASE_URL": database_url, "POLAR_BROKER_URL": "memory://", "POLAR_API_TOKEN": ""}
    stack = Stack([gunicorn_spec("api", "web.api:create_app()", free_port(), workers=1)], env, tmp_path / "logs")
    with pytest.raises(RuntimeError, match=r"api exited with [1-9]"):
        stack.start(timeout_s=60)
    log = stack.log("api").read_text()
    assert "POLAR_API_TOKEN is not set" in log and "secrets.token_urlsafe(32)" in log


@pytest.mark.parametrize("headers", [{}, bearer("wrong"), bearer(READ + "x"), {"Authorization": ADMIN}])
def test_a_missing_or_wrong_token_is_401_on_every_route_but_healthz(app: Flask, headers: dict[str, str]) -> None:
    client = app.test_client()
    assert client.get("/healthz", headers=headers).status_code == 200
    some_id = uuid.uuid4()
    for method, path in [
        ("GET", f"/v1/batches/{some_id}"), ("GET", "/v1/trajectories"), ("GET", "/v1/engine"),
        ("POST", "/v1/batches"), ("POST", f"/v1/batches/{some_id}/cancel"), ("POST", "/v1/engine/pause"),
    ]:  # fmt: skip
        response = client.open(path, method=method, headers=headers, json={})
        assert response.status_code == 401, (method, path)
        assert response.json["error"]["status"] == 401 and "bearer token" in response.json["error"]["message"]
    assert sql(app, "SELECT count(*) FROM audit_log") == [(0,)]


def test_the_read_token_reads_everything(app: Flask) -> None:
    batch_id = submit(app).json["batch_id"]
    session_id = sql(app, "SELECT id FROM sessions WHERE batch_id = :b LIMIT 1", b=batch_id)[0][0]
    client = app.test_client()
    for path in [
        f"/v1/batches/{batch_id}", f"/v1/batches/{batch_id}/sessions", f"/v1/sessions/{session_id}",
        f"/v1/sessions/{session_id}/calls", f"/v1/sessions/{session_id}/trajectories",
        f"/v1/trajectories?batch_id={batch_id}", f"/v1/batches/{batch_id}/export?kind=rl&format=jsonl",
        "/v1/engine", "/healthz",
    ]:  # fmt: skip
        assert client.get(path, headers=bearer(READ)).status_code == 200, path


def test_every_route_that_is_not_a_read_is_forbidden_to_the_read_token(app: Flask) -> None:
    batch_id = submit(app).json["batch_id"]
    counts = "SELECT (SELECT count(*) FROM batches), (SELECT count(*) FROM sessions WHERE state = 'pending')"
    before = sql(app, counts)
    self_checking = app.extensions[SELF_AUTHENTICATING]
    own_check = [
        (method, rule.rule)
        for rule in app.url_map.iter_rules()
        if rule.endpoint.partition(".")[0] in self_checking
        for method in sorted((rule.methods or set()) - SAFE)
    ]
    assert own_check == [("POST", "/ui/login")]  # the sign-in form writes nothing; any other write must be below
    writes = [
        (method, rule.rule.replace("<batch_id>", batch_id))
        for rule in app.url_map.iter_rules()
        if rule.endpoint.partition(".")[0] not in self_checking
        for method in sorted((rule.methods or set()) - SAFE)
    ]
    assert {path for _, path in writes} >= {
        "/v1/batches",
        f"/v1/batches/{batch_id}/cancel",
        "/v1/engine/pause",
        "/v1/engine/resume",
    }
    client = app.test_client()
    for method, path in writes:
        body = {"tasks": [command_task("b", "true")]} if path == "/v1/batches" else {"mode": "wait"}
        response = client.open(path, method=method, headers=bearer(READ), json=body)
        assert response.status_code == 403, (method, path)
        error = response.json["error"]
        assert error["status"] == 403 and "read-only" in error["message"] and "POLAR_API_TOKEN" in error["message"]
    assert sql(app, counts) == before
    assert client.get("/v1/engine", headers=bearer(READ)).json["paused"] is False
    denied = sql(app, "SELECT actor, action, detail FROM audit_log WHERE action = 'denied' ORDER BY id")
    assert [row[2]["path"] for row in denied] == [path for _, path in writes]
    assert {row[0] for row in denied} == {f"read:{fingerprint(READ)}"}


def test_the_admin_token_leaves_an_audit_trail(app: Flask) -> None:
    admin, reader = f"admin:{fingerprint(ADMIN)}", f"read:{fingerprint(READ)}"
    submitted = submit(app)
    assert submitted.status_code == 201
    batch_id = submitted.json["batch_id"]
    again = submit(app, **{"Idempotency-Key": "k"})
    replay = submit(app, **{"Idempotency-Key": "k"})
    assert again.status_code == 201 and replay.status_code == 200  # a replay starts nothing and is not audited
    client = app.test_client()
    assert client.post(f"/v1/batches/{batch_id}/cancel", headers=bearer(ADMIN)).status_code == 202
    assert client.post("/v1/engine/pause", headers=bearer(ADMIN), json={"policy_version": "v2"}).status_code == 200
    assert client.post("/v1/engine/resume", headers=bearer(ADMIN)).status_code == 200
    export = client.get(f"/v1/batches/{batch_id}/export?kind=sft&format=jsonl&min_reward=0.5", headers=bearer(READ))
    assert export.status_code == 200
    for _ in range(3):  # the trainers' feed is polled all day: reads that are not exports leave no rows
        assert client.get("/v1/trajectories", headers=bearer(READ)).status_code == 200

    rows = sql(app, "SELECT actor, action, target, remote_addr, detail FROM audit_log ORDER BY id")
    assert [(actor, action) for actor, action, *_ in rows] == [
        (admin, "submit"), (admin, "submit"), (admin, "cancel"), (admin, "pause"), (admin, "resume"),
        (reader, "export"),
    ]  # fmt: skip
    assert [row[2] for row in rows] == [batch_id, again.json["batch_id"], batch_id, "engine", "engine", batch_id]
    assert {row[3] for row in rows} == {"127.0.0.1"}
    details = [row[4] for row in rows]
    assert details[0] == {"name": "audited", "num_sessions": 2, "idempotency_key": None}
    assert details[2] == {"cancelled": 2, "stopping": 0}
    engines = details[3].pop("engines")  # each engine's pause: none listens at the default POLAR_ENGINE_URLS here
    assert details[3] == {"paused": True, "mode": "reject", "policy_version": "v2"}
    assert [(e["kind"], e["ok"]) for e in engines] == [("vllm", False)]
    # nothing completed (the batch was cancelled), and the row says so
    assert details[5] == {"kind": "sft", "format": "jsonl", "min_reward": 0.5, "sessions": 0, "accepted": 0, "rows": 0}
    submitters = sql(app, "SELECT submitted_by FROM batches WHERE id IN (:a, :b)", a=batch_id, b=again.json["batch_id"])
    assert submitters == [(admin,), (admin,)]
    trail = sql(app, "SELECT action, batch_name FROM audit_trail WHERE batch_id = :b ORDER BY id", b=batch_id)
    assert trail == [("submit", "audited"), ("cancel", "audited"), ("export", "audited")]
    everything = str(sql(app, "SELECT * FROM audit_log")) + str(sql(app, "SELECT submitted_by FROM batches"))
    assert ADMIN not in everything and READ not in everything


def test_an_image_is_served_to_both_tokens_and_to_no_one_else(app: Flask) -> None:
    from polar.storage.media import MediaStore, StoredImage

    data = b"\x89PNG\r\n\x1a\n" + uuid.uuid4().bytes  # the route serves what is stored; it does not decode it
    sha = hashlib.sha256(data).hexdigest()
    with app.extensions["polar"].db.engine.begin() as connection:
        MediaStore().store(connection, [StoredImage(sha, "image/png", data)])
    client = app.test_client()
    for token in (ADMIN, READ):
        answer = client.get(f"/v1/media/{sha}", headers=bearer(token))
        assert answer.status_code == 200 and answer.data == data and answer.mimetype == "image/png"
    assert client.get(f"/v1/media/{sha}").status_code == 401
    assert client.get(f"/v1/media/{sha}", headers=bearer("wrong-" + "c" * 30)).status_code == 401
    assert client.get(f"/v1/media/{'0' * 64}", headers=bearer(READ)).status_code == 404
    assert client.get("/v1/media/not-a-sha", headers=bearer(READ)).status_code == 400
