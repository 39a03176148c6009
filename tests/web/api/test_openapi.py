"""``/openapi.json`` describes the API it is served by: every route and nothing else, a valid OpenAPI 3.1 document,
bodies and errors from the same models and shapes the code uses (``web.api.openapi``, ``web.api.operations``).

The live fuzzing of the API against it is ``tests/e2e/test_openapi.py``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from flask import Flask
from openapi_spec_validator import validate

from polar.config import load_config
from polar.contract.task_request import BatchRequest
from web.api import create_app
from web.api.openapi import build_document, described_routes, openapi_path
from web.api.operations import OPERATIONS

TOKEN = "openapi-admin-token-" + "0" * 20
README_BATCH = {
    "name": "demo",
    "tasks": [
        {
            "task_id": "mul",
            "instruction": "What is 17 * 23?",
            "num_samples": 4,
            "timeout_seconds": 120,
            "runtime": {"backend": "local", "prepare": [{"run": "git init -q"}, {"copy": "/data/repo", "to": "repo"}]},
            "harness": {"name": "python", "command": "polar.agents.calculator:run"},
            "evaluator": {"name": "session_completion"},
            "metadata": {"group_id": "g1"},
        }
    ],
}


@pytest.fixture(scope="module")
def app(module_database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Flask]:
    env = {"POLAR_DATABASE_URL": module_database_url, "POLAR_BROKER_URL": "memory://", "POLAR_API_TOKEN": TOKEN}
    app = create_app(load_config(env, cwd=tmp_path_factory.mktemp("openapi")))
    yield app
    app.extensions["polar"].db.dispose()


@pytest.fixture(scope="module")
def document(app: Flask) -> dict[str, Any]:
    response = app.test_client().get("/openapi.json")  # no token: it is documentation
    assert response.status_code == 200 and response.headers["Access-Control-Allow-Origin"] == "*"
    return response.json  # type: ignore[no-any-return]


def coverage(app: Flask) -> tuple[set[str], set[str]]:
    """Routes without an entry in OPERATIONS, and entries without a route."""
    routes = {endpoint for endpoint, _, _ in described_routes(app.url_map)}
    return routes - set(OPERATIONS), set(OPERATIONS) - routes


def test_every_route_is_described_and_nothing_else(app: Flask, document: dict[str, Any]) -> None:
    assert coverage(app) == (set(), set())
    described = {(path, method.upper()) for path, item in document["paths"].items() for method in item}
    routes = {(openapi_path(rule), method) for _, method, rule in described_routes(app.url_map)}
    assert described == routes
    assert not any(path.startswith("/ui") for path, _ in described)  # the console's HTML pages are not the API


def test_a_route_added_without_a_description_is_caught(tmp_path: Path, module_database_url: str) -> None:
    env = {"POLAR_DATABASE_URL": module_database_url, "POLAR_BROKER_URL": "memory://", "POLAR_API_TOKEN": TOKEN}
    app = create_app(load_config(env, cwd=tmp_path))
    app.add_url_rule("/v1/things/<thing_id>", "things.show", lambda thing_id: thing_id)
    try:
        assert coverage(app) == ({"things.show"}, set())
        assert "/v1/things/{thing_id}" not in build_document(app.url_map)["paths"]
    finally:
        app.extensions["polar"].db.dispose()


def test_the_document_is_valid_openapi_3_1(document: dict[str, Any]) -> None:
    validate(document)
    assert document["openapi"] == "3.1.0"
    assert document["components"]["securitySchemes"]["bearerAuth"] == {
        **document["components"]["securitySchemes"]["bearerAuth"], "type": "http", "scheme": "bearer"
    }  # fmt: skip


def _schema(document: dict[str, Any], ref: dict[str, str]) -> dict[str, Any]:
    """``ref`` resolved against the document, as a standalone JSON Schema."""
    return {**ref, "components": document["components"]}


def test_the_batch_body_is_the_validating_model(document: dict[str, Any]) -> None:
    body = document["paths"]["/v1/batches"]["post"]["requestBody"]
    ref = body["content"]["application/json"]["schema"]
    assert body["required"] and ref == {"$ref": "#/components/schemas/BatchRequest"}
    generated = BatchRequest.model_json_schema(ref_template="#/components/schemas/{model}")
    assert document["components"]["schemas"]["BatchRequest"] == {
        key: value for key, value in generated.items() if key != "$defs"
    }
    batch_schema = _schema(document, ref)
    jsonschema.validate(README_BATCH, batch_schema)  # what the README submits is what the schema allows
    bad = {"tasks": [{**README_BATCH["tasks"][0], "colour": "blue"}]}
    with pytest.raises(jsonschema.ValidationError, match="colour"):
        jsonschema.validate(bad, batch_schema)  # unknown fields: refused by both (test_api.py has the API's 400)


def test_errors_are_described_with_their_shape(app: Flask, document: dict[str, Any]) -> None:
    client = app.test_client()
    headers = {"Authorization": f"Bearer {TOKEN}"}
    missing = client.get("/v1/batches/00000000-0000-0000-0000-000000000000", headers=headers)
    anonymous = client.get("/v1/engine")
    wrong_method = client.delete("/v1/batches", headers=headers)
    error_schema = _schema(document, {"$ref": "#/components/schemas/ErrorJSON"})
    for response, status in ((missing, 404), (anonymous, 401), (wrong_method, 405)):
        assert response.status_code == status
        jsonschema.validate(response.json, error_schema)
    assert set(wrong_method.headers["Allow"].split(", ")) == {"POST", "OPTIONS"}  # RFC 9110: a 405 lists them
    for path, item in document["paths"].items():
        for method, operation in item.items():
            statuses = set(operation["responses"])
            role = operation["x-polar-role"]
            assert "500" in statuses, (method, path)
            assert ("401" in statuses) == (role != "open"), (method, path)
            assert ("403" in statuses) == (role == "admin"), (method, path)
            assert ("404" in statuses) or "{" not in path, (method, path)
            assert operation.get("security") == ([] if role == "open" else None), (method, path)
