"""``GET /openapi.json``: the rollout API described as OpenAPI 3.1, assembled from code so it cannot drift.

Paths and methods come from the app's url_map; what each route takes and returns from ``web.api.operations``
(keyed by endpoint), whose schemas pydantic generates from the models that validate requests and the TypedDicts
the serializers are typed with. The console (``/ui/``: HTML pages, docs/console.md) is not part of it.

Served without a token and with ``Access-Control-Allow-Origin: *``: it describes shapes and holds no data, and a
Swagger UI or Redoc page served from elsewhere can load it (docs/api.md).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from flask import Blueprint, Flask, Response, current_app, jsonify
from pydantic import TypeAdapter
from werkzeug.routing import Map, Rule

from polar.records.provenance import polar_version
from web.api.auth import authenticates_itself
from web.api.operations import OPERATIONS, Operation, Reply
from web.errors import ErrorJSON

blueprint = Blueprint("openapi", __name__)

UNDESCRIBED_BLUEPRINTS = frozenset({"console"})
IMPLICIT_METHODS = frozenset({"HEAD", "OPTIONS"})  # Flask answers them for every route
_CACHE = "polar.openapi"
_SCHEMAS = "#/components/schemas/{model}"
_ARGUMENT = re.compile(r"<(?:[^:<>]+:)?([^<>]+)>")
_PATH_SCHEMAS = {"sha256": {"type": "string", "pattern": "^[0-9a-f]{64}$"}}
_PATH_IDS = {"batch_id": "A batch id (a UUID).", "session_id": "A session id (a UUID).",
             "sha256": "An image's sha256 (64 lower-case hex digits)."}  # fmt: skip

SECURITY = {
    "type": "http",
    "scheme": "bearer",
    "description": "POLAR_API_TOKEN, the admin token, may do everything; POLAR_API_READ_TOKEN (optional), the "
    "read-only token for trainers and viewers, may call the GET routes (the others answer it 403). A missing or "
    "wrong token is 401.",
}
TAGS = [
    {"name": "batches", "description": "Submit batches, follow and cancel them, export their training data."},
    {"name": "sessions", "description": "One session: its state changes, captured calls and trajectories."},
    {"name": "feed", "description": "The trainers' feed of finished trajectories, behind a cursor."},
    {"name": "engine", "description": "Hold model calls while a trainer syncs weights."},
    {"name": "service", "description": "Liveness, metrics and this description."},
]
ERRORS = {
    400: "The request is malformed; ``error.field`` names the offending field when there is one.",
    401: "Missing or wrong bearer token.",
    403: "The read-only token may not do this; it needs the admin token (POLAR_API_TOKEN).",
    404: "No such resource (ids are UUIDs).",
    413: "The body is larger than POLAR_MAX_BODY_BYTES.",
    500: "An internal error (logged by the API).",
}

# Answered by gunicorn before the app sees the request, so in its own shape (the app answers everything else).
SERVER_414 = {
    "description": "The request line (method, path and query) is longer than the server reads (gunicorn's "
    "limit_request_line, 4094 bytes by default).",
    "content": {"text/html": {"schema": {"type": "string"}}},
}


def described_routes(url_map: Map) -> Iterator[tuple[str, str, Rule]]:
    """``(endpoint, method, rule)`` of every route the document must describe: the app's routes without the
    console's and without the HEAD and OPTIONS Flask answers by itself."""
    for rule in url_map.iter_rules():
        if rule.endpoint == "static" or rule.endpoint.partition(".")[0] in UNDESCRIBED_BLUEPRINTS:
            continue
        for method in sorted((rule.methods or set()) - IMPLICIT_METHODS):
            yield rule.endpoint, method, rule


def openapi_path(rule: Rule) -> str:
    """``/v1/batches/<batch_id>`` as OpenAPI writes it: ``/v1/batches/{batch_id}``."""
    return _ARGUMENT.sub(r"{\1}", rule.rule)


def build_document(url_map: Map) -> dict[str, Any]:
    """The OpenAPI 3.1 document of the routes of ``url_map`` that ``OPERATIONS`` describes."""
    routes = [
        (endpoint, method, rule) for endpoint, method, rule in described_routes(url_map) if endpoint in OPERATIONS
    ]
    refs, components = _schemas([OPERATIONS[endpoint] for endpoint, _, _ in routes])
    paths: dict[str, dict[str, Any]] = {}
    for endpoint, method, rule in routes:
        paths.setdefault(openapi_path(rule), {})[method.lower()] = _operation(endpoint, rule, refs)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Polar rollout API",
            "version": polar_version(),
            "description": "Submit batches of agent-harness sessions, follow them, and read what they captured "
            "(calls, trajectories, the trainers' feed, exports). Errors are JSON: "
            '``{"error": {"message", "status", "field"?}}``.',
        },
        "tags": TAGS,
        "paths": dict(sorted(paths.items())),
        "components": {"schemas": components, "securitySchemes": {"bearerAuth": SECURITY}},
        "security": [{"bearerAuth": []}],
    }


def _schemas(operations: list[Operation]) -> tuple[dict[Any, dict[str, Any]], dict[str, Any]]:
    """``$ref`` per (type, mode) and the component schemas, generated by pydantic in one pass (shared models
    appear once)."""
    wanted: dict[tuple[Any, str], None] = {(ErrorJSON, "serialization"): None}
    for operation in operations:
        if operation.body is not None:
            wanted[(operation.body, "validation")] = None
        for reply in operation.replies.values():
            if reply.body is not None:
                wanted[(reply.body, "serialization")] = None
    inputs = [(kind, mode, TypeAdapter(kind)) for kind, mode in wanted]
    refs, definitions = TypeAdapter.json_schemas(inputs, ref_template=_SCHEMAS)  # type: ignore[arg-type]
    return dict(refs), dict(sorted(definitions.get("$defs", {}).items()))


def _operation(endpoint: str, rule: Rule, refs: dict[Any, dict[str, Any]]) -> dict[str, Any]:
    operation = OPERATIONS[endpoint]
    parameters = [
        {"name": name, "in": "path", "required": True, "description": _PATH_IDS.get(name, name),
         "schema": _PATH_SCHEMAS.get(name) or ({"type": "string", "format": "uuid"} if name.endswith("_id")
                                               else {"type": "string"})}
        for name in sorted(rule.arguments)
    ] + [
        {"name": p.name, "in": p.where, "required": False, "description": p.description, "schema": p.schema}
        for p in operation.params
    ]  # fmt: skip
    described: dict[str, Any] = {
        "operationId": endpoint.replace(".", "_"),
        "summary": operation.summary,
        "tags": [operation.tag],
        "x-polar-role": operation.role,
    }
    if operation.description:
        described["description"] = operation.description
    if parameters:
        described["parameters"] = parameters
    if operation.body is not None:
        described["requestBody"] = {
            "required": operation.body_required,
            "content": {"application/json": {"schema": refs[(operation.body, "validation")]}},
        }
    responses = {str(status): _reply(reply, refs) for status, reply in operation.replies.items()}
    for status, description in sorted(_errors(operation, rule).items()):
        error: dict[str, Any] = {
            "description": description,
            "content": {"application/json": {"schema": refs[(ErrorJSON, "serialization")]}},
        }
        if status == 429:
            error["headers"] = {"Retry-After": {"schema": {"type": "integer", "minimum": 0}}}
        responses[str(status)] = error
    responses["414"] = SERVER_414
    described["responses"] = dict(sorted(responses.items()))
    if operation.role == "open":
        described["security"] = []
    return described


def _errors(operation: Operation, rule: Rule) -> dict[int, str]:
    """The error statuses the operation can answer: those of its kind, then its own."""
    statuses = [500]
    if operation.role != "open":
        statuses.append(401)
    if operation.role == "admin":
        statuses.append(403)
    if rule.arguments:
        statuses.append(404)
    if operation.params or operation.body is not None:
        statuses.append(400)
    if operation.body is not None:
        statuses.append(413)
    return {**{status: ERRORS[status] for status in statuses}, **operation.errors}


def _reply(reply: Reply, refs: dict[Any, dict[str, Any]]) -> dict[str, Any]:
    described: dict[str, Any] = {"description": reply.description or "OK"}
    if reply.body is not None:
        described["content"] = {"application/json": {"schema": refs[(reply.body, "serialization")]}}
    elif reply.content:
        described["content"] = {media: {"schema": schema} for media, schema in reply.content.items()}
    if reply.headers:
        described["headers"] = {name: {"schema": schema} for name, schema in reply.headers.items()}
    return described


@blueprint.get("/openapi.json")
def document() -> Response:
    # Built once per process: the routes and models cannot change while it runs.
    built = current_app.extensions.get(_CACHE)
    if built is None:
        built = current_app.extensions.setdefault(_CACHE, build_document(current_app.url_map))
    response = jsonify(built)
    response.headers["Access-Control-Allow-Origin"] = "*"
    return response


def install(app: Flask) -> None:
    """Serve ``/openapi.json`` on ``app``, without a token."""
    app.register_blueprint(blueprint)
    authenticates_itself(app, blueprint.name)  # documentation: nothing to check
