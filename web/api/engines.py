"""``/v1/engines``: the fleet of inference engines, and adding or draining one at run time."""

from __future__ import annotations

from typing import Annotated

import pydantic
from flask import Blueprint, Response, jsonify
from pydantic import BaseModel, ConfigDict, Field

from polar.contract.engine_addresses import ENGINE_URL_PATTERN, engine_label
from polar.contract.task_request import first_error
from polar.fleet.overview import add_engine, drain_engine, fleet_status
from web.api.auth import caller
from web.api.requests import json_body, services

blueprint = Blueprint("engines", __name__, url_prefix="/v1/engines")


class EngineRequest(BaseModel):
    """``POST /v1/engines`` and ``POST /v1/engines/drain``: which engine."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    # http(s)://host:port (vLLM's protocol) or sglang+http(s)://host:port (SGLang's native one).
    url: Annotated[str, Field(min_length=1, max_length=2000, pattern=ENGINE_URL_PATTERN)]


def _request() -> EngineRequest:
    try:
        return EngineRequest.model_validate(json_body())
    except pydantic.ValidationError as exc:
        raise first_error(exc) from exc


@blueprint.get("")
def listing() -> Response:
    return jsonify({"engines": fleet_status(services().config, services().db)})


@blueprint.post("")
def add() -> tuple[Response, int]:
    from polar.records.audit import record_now

    address = add_engine(services().db, _request().url, caller().actor)
    record_now(services().db, caller(), "add_engine", engine_label(address), {"kind": address.kind})
    return jsonify({"url": engine_label(address), "kind": address.kind, "drained": False}), 201


@blueprint.post("/drain")
def drain() -> Response:
    from polar.records.audit import record_now

    address = drain_engine(services().db, _request().url)
    record_now(services().db, caller(), "drain_engine", engine_label(address), {"kind": address.kind})
    return jsonify({"url": engine_label(address), "kind": address.kind, "drained": True})
