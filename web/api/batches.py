"""``/v1/batches``: submit a batch, read its progress and its sessions."""

from __future__ import annotations

from flask import Blueprint, Response, jsonify, request

from polar.batches.cancel import cancel_batch
from polar.contract.task_request import parse_batch_request
from polar.errors import ValidationError
from polar.lifecycle.batches import batch_status, request_hash, submit_batch
from polar.lifecycle.sessions import list_sessions
from polar.records.audit import record_now
from polar.storage.serialization import batch_json
from web.api.auth import caller
from web.api.requests import IntArg, json_body, parse_id, query_arg, services

blueprint = Blueprint("batches", __name__, url_prefix="/v1/batches")

SESSIONS_LIMIT = IntArg("limit", 100, 1, 1000)
SESSIONS_OFFSET = IntArg("offset", 0, 0, 10**9)
MAX_IDEMPOTENCY_KEY = 255


@blueprint.post("")
def create() -> tuple[Response, int]:
    body = json_body()
    batch_request = parse_batch_request(body)
    key = request.headers.get("Idempotency-Key")  # an empty one is a mistake, not "no key"
    if key is not None and not 0 < len(key) <= MAX_IDEMPOTENCY_KEY:
        raise ValidationError(
            f"Idempotency-Key: must be 1 to {MAX_IDEMPOTENCY_KEY} characters", field="Idempotency-Key"
        )
    submitted = submit_batch(services(), batch_request, request_hash(body), key, caller=caller())
    payload = {"batch_id": str(submitted.batch_id), "num_sessions": submitted.num_sessions}
    return jsonify(payload), 201 if submitted.created else 200


@blueprint.get("/<batch_id>")
def show(batch_id: str) -> Response:
    status = batch_status(services(), parse_id(batch_id, "batch"))
    return jsonify(batch_json(status["batch"], status["status"], status["counts"], status["attempts"]))


@blueprint.get("/<batch_id>/sessions")
def sessions(batch_id: str) -> Response:
    page = list_sessions(
        services(),
        parse_id(batch_id, "batch"),
        limit=SESSIONS_LIMIT.read(),
        offset=SESSIONS_OFFSET.read(),
        after=query_arg("after"),
    )
    return jsonify(page)


@blueprint.post("/<batch_id>/cancel")
def cancel(batch_id: str) -> tuple[Response, int]:
    result = cancel_batch(services(), parse_id(batch_id, "batch"))
    record_now(services().db, caller(), "cancel", str(result.batch_id),
               {"cancelled": result.cancelled, "stopping": result.stopping})  # fmt: skip
    payload = {"batch_id": str(result.batch_id), "cancelled": result.cancelled, "stopping": result.stopping}
    return jsonify(payload), 202
