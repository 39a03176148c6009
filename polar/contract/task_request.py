"""The batch and task request contract (DESIGN.md §3), validated strictly.

Unknown fields and wrong types are rejected with a ``ValidationError`` naming the field, e.g.
``tasks[0].harness.name``. Batch ``defaults`` are merged under each task before validation.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import pydantic
from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator, model_validator

from polar.codec.import_path import IMPORT_PATH
from polar.errors import ValidationError

MAX_SESSIONS_PER_BATCH = 100_000
_HOST_PORT = re.compile(r"(\*\.)?[A-Za-z0-9.-]{1,253}:\d{1,5}|\[[0-9A-Fa-f:.]+\]:\d{1,5}")
DEFAULT_MAX_ATTEMPTS = 3


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


DEFAULT_PRIORITY = 50
# The most images one task may carry (``TaskRequest.images``).
MAX_TASK_IMAGES = 16
# The most times a flaky prepare step may be run again after it failed (``retry_on_failure``).
MAX_STEP_RETRIES = 5


class RunStep(_Strict):
    run: str = Field(min_length=1)
    timeout_seconds: float | None = Field(default=None, gt=0)
    # Runs again after a failure (non-zero exit, or its own timeout) up to this many times, within the session
    # budget: for a step known to be flaky (a network fetch). polar.stages.init.
    retry_on_failure: int = Field(default=0, ge=0, le=MAX_STEP_RETRIES)


class CopyStep(_Strict):
    # A host path under the operator's POLAR_COPY_ROOTS (checked at submission and again at copy time).
    copy_: str = Field(alias="copy", min_length=1)
    # Where it goes: relative to the session's work directory, never outside it.
    to: str = Field(min_length=1)

    @field_validator("copy_", "to")
    @classmethod
    def _no_nul(cls, value: str) -> str:
        if "\x00" in value:
            raise ValueError("must not contain a NUL character")
        return value

    @field_validator("to")
    @classmethod
    def _inside_work(cls, to: str) -> str:
        path = PurePosixPath(to)
        if path.is_absolute() or ".." in path.parts:
            raise ValueError("must be a path relative to the session's work directory, without '..'")
        return to


def _step_kind(value: Any) -> str:
    if isinstance(value, Mapping):
        return "copy_step" if "copy" in value else "run_step"
    return "copy_step" if isinstance(value, CopyStep) else "run_step"


PrepareStep = Annotated[
    Annotated[RunStep, Tag("run_step")] | Annotated[CopyStep, Tag("copy_step")], Discriminator(_step_kind)
]


class EarlyStop(_Strict):
    # Once this many samples of the group settled with a task outcome, the rest are cancelled (polar.stages.early_stop).
    min_usable: int = Field(ge=1)


class Limits(_Strict):
    cpus: float | None = Field(default=None, gt=0)
    memory_mb: int | None = Field(default=None, gt=0)
    pids: int | None = Field(default=None, gt=0)
    # The sandbox's sockets (polar.runtimes.bounds); None: the deployment's POLAR_SANDBOX_MAX_CONNECTIONS,
    # POLAR_SANDBOX_REQUEST_SEND_S and POLAR_SANDBOX_TUNNEL_IDLE_S.
    connections: int | None = Field(default=None, gt=0, le=1024)
    request_send_s: float | None = Field(default=None, gt=0, le=3600)
    tunnel_idle_s: float | None = Field(default=None, gt=0, le=86400)
    # The session directory's size in MiB, bwrap and docker (polar.runtimes.session_disk); None: the deployment's
    # POLAR_SANDBOX_DISK_MB.
    disk_mb: int | None = Field(default=None, ge=16, le=1024 * 1024)


class RuntimeSpec(_Strict):
    # None: the deployment's POLAR_DEFAULT_RUNTIME, filled in at submission.
    backend: Literal["local", "bwrap", "docker"] | None = None
    image: str | None = None
    prepare: list[PrepareStep] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    # Where commands start inside a Docker container (e.g. an image's /testbed); default: the session's work/.
    workdir: str | None = None
    limits: Limits = Field(default_factory=Limits)
    # Docker: the image's filesystem read-only (the session directory stays writable, /tmp is a tmpfs).
    read_only_root: bool = False
    # Outside hosts a bwrap / docker sandbox may open tunnels to (``host:port``, ``*.example.org:443``);
    # none by default: the proxy is all a sandbox reaches (polar.runtimes.egress).
    egress_allow: list[str] = Field(default_factory=list, max_length=64)

    @field_validator("egress_allow")
    @classmethod
    def _host_ports(cls, value: list[str]) -> list[str]:
        for entry in value:
            if not _HOST_PORT.fullmatch(entry):
                raise ValueError(f"{entry!r}: write host:port (a leading '*.' for subdomains), e.g. pypi.org:443")
        return value

    @model_validator(mode="after")
    def _workdir_in_a_container(self) -> RuntimeSpec:
        if self.workdir is not None:
            if self.backend not in ("docker", None):
                raise ValueError("workdir: only a docker runtime has a directory of its own to start in")
            if not self.workdir.startswith("/"):
                raise ValueError("workdir: must be an absolute path inside the container")
        return self


HarnessName = Literal[
    "command",
    "python",
    "claude_code",
    "codex",
    "gemini_cli",
    "qwen_code",
    "opencode",
    "pi",
    "mini_swe_agent",
    "hermes",
    "openclaw",
    "oracle",
    "kilocode",
    "cline",
    "mistral_vibe",
    "droid",
    "kimi_cli",
    "aider",
]


class HarnessSpec(_Strict):
    name: HarnessName
    command: str | None = None
    model: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    settings: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _command_given(self) -> HarnessSpec:
        if self.name == "command" and not self.command:
            raise ValueError("command: the command harness needs a shell command")
        if self.name == "python" and not IMPORT_PATH.fullmatch(self.command or ""):
            raise ValueError("command: the python harness needs 'module:function'")
        return self


class EvaluatorSpec(_Strict):
    name: str = Field(default="session_completion", min_length=1)
    config: dict[str, Any] = Field(default_factory=dict)


class TaskRequest(_Strict):
    task_id: str = Field(min_length=1, max_length=512)
    instruction: str
    num_samples: int = Field(default=1, ge=1, le=10_000)
    timeout_seconds: float = Field(default=600.0, gt=0, le=7 * 24 * 3600)
    runtime: RuntimeSpec = Field(default_factory=RuntimeSpec)
    harness: HarnessSpec
    reconstruction: Literal["prefix_merging", "per_request"] = "per_request"
    # A segment with no explained edge (polar.reconstruction.segments): strict masks the whole sample, lenient
    # trains it like the others.
    segments: Literal["strict", "lenient"] = "strict"
    # Token-in-token-out: build each prompt from the session's own earlier tokens (polar.proxy.tito).
    token_in_token_out: bool = False
    evaluator: EvaluatorSpec = Field(default_factory=EvaluatorSpec)
    # The reward of a session whose work broke, hung or tampered with its judging (polar.errors.EvaluationError,
    # UnsafePath): a finite number, so such a session is the policy's failure, never an unscored sample.
    failure_reward: float = Field(default=0.0, allow_inf_nan=False)
    # Attempts per sample: one lost to the infrastructure (a killed worker, a lost node, the engine failing the
    # harness's calls) is retried up to this many in all (polar.lifecycle.attempts).
    max_attempts: int = Field(default=DEFAULT_MAX_ATTEMPTS, ge=1, le=20)
    # Per-session proxy limits (polar.proxy.limits); unset: POLAR_SESSION_MAX_CONCURRENT_CALLS / _MAX_CALLS.
    max_concurrent_calls: int | None = Field(default=None, ge=1)
    max_calls: int | None = Field(default=None, ge=1)
    # A call over max_calls: refused with the protocol's 429 (refuse), or answered with a final stop reply in the
    # caller's protocol, so the harness ends and its work is still graded (stop; polar.proxy.budget).
    over_budget: Literal["refuse", "stop"] = "refuse"
    # record: send the sampling parameters the harness asked for; neutralize: temperature 1, top_p 1, no top_k,
    # min_p or penalties (on-policy RL). Both record what was asked and what was sent (polar.proxy.sampling).
    sampling: Literal["record", "neutralize"] = "record"
    metadata: dict[str, Any] = Field(default_factory=dict)
    # Images copied into the work directory before the harness starts (polar.runtimes.task_images): a data URL
    # lands as image-<n>.<ext> (n from 1, its place in the list), a host path under POLAR_COPY_ROOTS under its own
    # name.
    images: list[str] = Field(default_factory=list, max_length=MAX_TASK_IMAGES)
    # Admission takes higher first (polar.lifecycle.admission); a running session is never preempted. A batch's
    # ``priority`` is its tasks' default.
    priority: int = Field(default=DEFAULT_PRIORITY, ge=0, le=100)
    # Stop the group's stragglers once enough samples are usable (polar.stages.early_stop); None: every sample runs.
    early_stop: EarlyStop | None = None

    @field_validator("images")
    @classmethod
    def _image_sources(cls, images: list[str]) -> list[str]:
        for index, image in enumerate(images):
            if "\x00" in image:
                raise ValueError(f"[{index}]: must not contain a NUL character")
            if not (image.startswith("data:") or image.startswith("/")):
                raise ValueError(f"[{index}]: must be a data URL (data:image/png;base64,...) or an absolute host path")
        return images

    @model_validator(mode="after")
    def _early_stop_within_samples(self) -> TaskRequest:
        if self.early_stop is not None and self.early_stop.min_usable > self.num_samples:
            raise ValueError(f"early_stop.min_usable: {self.early_stop.min_usable} is more than num_samples "
                             f"({self.num_samples})")  # fmt: skip
        return self

    @field_validator("task_id")
    @classmethod
    def _printable(cls, value: str) -> str:
        if not value.isprintable():
            raise ValueError("must be printable text")
        return value


class BatchRequest(_Strict):
    name: str | None = Field(default=None, max_length=512)
    defaults: dict[str, Any] = Field(default_factory=dict)
    tasks: list[TaskRequest] = Field(min_length=1)
    # Every task's priority unless the task (or ``defaults``) names its own.
    priority: int | None = Field(default=None, ge=0, le=100)
    # The circuit breaker: after this many attempts in a row lost to the infrastructure, the batch stops admitting
    # (its unstarted sessions cancelled) and says why (polar.stages.circuit_breaker). None: never.
    max_consecutive_infra_losses: int | None = Field(default=None, ge=1)
    # POSTed {"event": "group_finished" | "batch_finished", ...} as groups and the batch finish
    # (polar.training.callbacks).
    callback_url: str | None = Field(default=None, max_length=2048)

    @field_validator("callback_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None:
            parts = urlsplit(value)
            if parts.scheme not in {"http", "https"} or not parts.netloc:
                raise ValueError("must be an http(s) URL")
        return value

    @property
    def num_sessions(self) -> int:
        return sum(task.num_samples for task in self.tasks)


def _merge(defaults: Mapping[str, Any], task: Mapping[str, Any]) -> dict[str, Any]:
    merged: dict[str, Any] = dict(defaults)
    for key, value in task.items():
        base = merged.get(key)
        merged[key] = _merge(base, value) if isinstance(base, Mapping) and isinstance(value, Mapping) else value
    return merged


def _field_path(loc: tuple[int | str, ...]) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part in {"run_step", "copy_step"}:
            continue  # pydantic names the union member in the location; users never wrote it
        else:
            path += f".{part}" if path else str(part)
    return path


def first_error(exc: pydantic.ValidationError, prefix: str = "") -> ValidationError:
    """One ``ValidationError`` naming the first bad field of ``exc`` (under ``prefix``, e.g.
    ``tasks[0].evaluator.config``), worded for the caller."""
    errors = exc.errors(include_url=False)
    # For a union (prepare steps) report the member that got furthest rather than every alternative.
    error = max(errors, key=lambda e: len(e["loc"]))
    field = _field_path(tuple(error["loc"]))
    if prefix:
        field = f"{prefix}{'' if field.startswith('[') else '.'}{field}" if field else prefix
    if error["type"] == "extra_forbidden":
        return ValidationError(f"{field}: unknown field", field=field)
    if error["type"] == "missing":
        return ValidationError(f"{field}: required field is missing", field=field)
    message = str(error["msg"]).removeprefix("Value error, ")
    return ValidationError(f"{field}: {message}", field=field)


def parse_batch_request(body: Any) -> BatchRequest:
    """Validate a decoded ``POST /v1/batches`` body; raise ``ValidationError`` naming the first bad field."""
    if not isinstance(body, Mapping):
        raise ValidationError("request body must be a JSON object", field=None)
    defaults = body.get("defaults", {})
    tasks = body.get("tasks")
    if isinstance(defaults, Mapping) and isinstance(tasks, list):
        body = {**body, "tasks": [_merge(defaults, t) if isinstance(t, Mapping) else t for t in tasks]}
    priority = body.get("priority")
    if priority is not None and isinstance(body.get("tasks"), list):  # the batch's, under each task's own
        body = {**body, "tasks": [{"priority": priority, **t} if isinstance(t, Mapping) else t for t in body["tasks"]]}
    try:
        request = BatchRequest.model_validate(body)
    except pydantic.ValidationError as exc:
        raise first_error(exc) from exc
    if request.num_sessions > MAX_SESSIONS_PER_BATCH:
        raise ValidationError(
            f"tasks: a batch may hold at most {MAX_SESSIONS_PER_BATCH} sessions, got {request.num_sessions}",
            field="tasks",
        )
    return request


def task_to_json(task: TaskRequest) -> dict[str, Any]:
    return task.model_dump(mode="json", by_alias=True)


def task_from_json(spec: Mapping[str, Any]) -> TaskRequest:
    return TaskRequest.model_validate(spec, strict=False)
