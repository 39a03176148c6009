"""``/v1/engine``: hold model calls while a trainer syncs weights, then resume with a new policy version.

The proxies stop starting calls first; then every engine is paused too (``engine_mode``, default ``keep``: calls
in flight freeze inside the engines and finish after resume, marked as spanning the update when the version
changed). Resume records the new version before the engines continue, so a held call ends under it.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, Literal, TypeVar

import pydantic
from flask import Blueprint, Response, jsonify, request
from pydantic import BaseModel, ConfigDict, Field

from polar.contract.task_request import first_error
from polar.errors import ValidationError
from polar.fleet.control import read_state, set_state
from polar.fleet.overview import fleet
from polar.records.audit import record_now
from polar.training.engine_sync import pause_engines, resume_engines
from web.api.auth import caller
from web.api.requests import json_body, services

blueprint = Blueprint("engine", __name__, url_prefix="/v1/engine")
NO_NUL = r"^[^\x00]*$"  # Postgres text holds no NUL character


class ResumeRequest(BaseModel):
    """``POST /v1/engine/resume``'s optional body (also the schema ``/openapi.json`` shows)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    # Stamped on every call captured from now on; omitted: the current version stays.
    policy_version: Annotated[str, Field(pattern=NO_NUL)] | int | None = None


class PauseRequest(ResumeRequest):
    """``POST /v1/engine/pause``'s optional body."""

    # reject: new calls get 429 + Retry-After; wait: they are held until resume (up to POLAR_PAUSE_MAX_WAITERS).
    mode: Literal["reject", "wait"] = "reject"
    # What every engine does with the calls it is generating (vLLM's /pause modes; SGLang's in_place is keep):
    # keep freezes them until resume, wait lets them finish first, abort ends them; none leaves engines running.
    engine_mode: Literal["keep", "wait", "abort", "none"] = "keep"
    # vLLM's clear_cache (its KV and prefix caches), for the modes that drain; ignored by keep.
    clear_cache: bool = False


_Options = TypeVar("_Options", bound=ResumeRequest)


def _options(model: type[_Options]) -> _Options:
    body = json_body() if request.content_length else {}
    if not isinstance(body, dict):
        raise ValidationError("request body must be a JSON object")
    try:
        return model.model_validate(body)
    except pydantic.ValidationError as exc:
        if any(error["loc"][:1] == ("policy_version",) for error in exc.errors()):
            # pydantic names the union member it tried last; the caller only wrote policy_version
            raise ValidationError(
                "policy_version: must be a string (without NUL characters) or an integer", field="policy_version"
            ) from exc
        raise first_error(exc) from exc


def _version(options: ResumeRequest) -> str | None:
    return None if options.policy_version is None else str(options.policy_version)


@blueprint.get("")
def show() -> Response:
    return jsonify(dataclasses.asdict(read_state(services().db)))


def _engines() -> list[Any]:
    return [address for address, _, drained in fleet(services().config, services().db) if not drained]


@blueprint.post("/pause")
def pause() -> Response:
    options = _options(PauseRequest)
    state: dict[str, Any] = dataclasses.asdict(set_state(services().db, True, options.mode, _version(options)))
    if options.engine_mode != "none":
        state["engines"] = pause_engines(_engines(), options.engine_mode, options.clear_cache)
    record_now(services().db, caller(), "pause", "engine", state)
    return jsonify(state)


@blueprint.post("/resume")
def resume() -> Response:
    options = _options(ResumeRequest)
    resumed = set_state(services().db, False, "reject", _version(options), credit_cap_s=services().config.max_pause_s)
    state: dict[str, Any] = dataclasses.asdict(resumed)
    state["engines"] = resume_engines(_engines(), state["policy_version"])
    record_now(services().db, caller(), "resume", "engine", state)
    return jsonify(state)
