"""What each route of the rollout API takes and returns: the table ``web.api.openapi`` turns into ``/openapi.json``.

Keyed by Flask endpoint (``blueprint.view``); the paths and methods come from the app's own url_map, the bodies'
and responses' schemas from the pydantic models that validate requests (``polar.contract.task_request``,
``web.api.engine``) and the TypedDicts the serializers are typed with (``polar.storage.serialization``, and the
envelopes below). A route without an entry here, or an entry without a route, fails ``tests/web/api/test_openapi.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, NotRequired

from pydantic import ConfigDict, with_config
from typing_extensions import TypedDict  # pydantic reads TypedDicts from typing_extensions on Python < 3.12

from polar.contract.task_request import BatchRequest
from polar.storage.serialization import (
    BatchJSON,
    CallPageJSON,
    FeedItemJSON,
    SessionEventsJSON,
    SessionJSON,
    SessionPageJSON,
    TrajectoryJSON,
    UUIDString,
)
from polar.training.export_formats import FORMATS, MEDIA_TYPES
from polar.training.exports import KINDS
from web.api.batches import MAX_IDEMPOTENCY_KEY, SESSIONS_LIMIT, SESSIONS_OFFSET
from web.api.engine import PauseRequest, ResumeRequest
from web.api.engines import EngineRequest
from web.api.sessions import CALLS_AFTER, CALLS_LIMIT
from web.api.trajectories import FEED_AFTER, FEED_LIMIT, MAX_WAIT_S

Role = Literal["admin", "read", "open"]
_CLOSED = ConfigDict(extra="forbid")


@with_config(_CLOSED)
class SubmittedJSON(TypedDict):
    batch_id: UUIDString
    num_sessions: int


@with_config(_CLOSED)
class CancelledJSON(TypedDict):
    batch_id: UUIDString
    cancelled: int  # sessions that had not started: ended at once
    stopping: int  # sessions prepared or running: going through postrun


@with_config(_CLOSED)
class TrajectoriesJSON(TypedDict):
    items: list[TrajectoryJSON]


@with_config(_CLOSED)
class FeedPageJSON(TypedDict):
    items: list[FeedItemJSON]
    next_cursor: int  # pass as ``after`` next time
    # With informative=true: whole groups on this page left out because their rewards do not vary.
    skipped_uninformative: NotRequired[int]


@with_config(_CLOSED)
class EngineStateJSON(TypedDict):
    paused: bool
    mode: Literal["reject", "wait"]
    policy_version: str | None


@with_config(_CLOSED)
class EngineActionJSON(TypedDict):
    url: str
    kind: Literal["vllm", "sglang"]
    ok: bool  # the engine did what was asked
    error: str | None  # why not: an unsupported version, a route it lacks (vLLM without dev mode), no answer
    version: NotRequired[str | None]  # what it reported (pause only)
    weight_version_set: NotRequired[bool]  # resume only: it took the new version (/update_weight_version)


@with_config(_CLOSED)
class EngineControlJSON(TypedDict):
    paused: bool
    mode: Literal["reject", "wait"]
    policy_version: str | None
    engines: NotRequired[list[EngineActionJSON]]  # each engine's pause or resume (absent: engine_mode none)


@with_config(_CLOSED)
class EngineJSON(TypedDict):
    url: str  # credentials removed
    kind: Literal["vllm", "sglang"]
    source: Literal["config", "api"]  # POLAR_ENGINE_URLS, or added through POST /v1/engines
    drained: bool
    healthy: bool  # answers /health and is not drained
    load: float | None  # running + waiting requests it reports (/metrics)
    version: str | None  # vLLM /version or SGLang /get_server_info
    policy_version: str | None  # the version Polar stamps on calls now
    weight_version: str | None  # the weight version the engine itself reports, where it has one
    error: str | None


@with_config(_CLOSED)
class EnginesJSON(TypedDict):
    engines: list[EngineJSON]


@with_config(_CLOSED)
class EngineChangeJSON(TypedDict):
    url: str
    kind: Literal["vllm", "sglang"]
    drained: bool


@with_config(_CLOSED)
class HealthJSON(TypedDict):
    status: Literal["ok", "unavailable"]
    database: NotRequired[str]  # only when unavailable: the kind of database error


@dataclass(frozen=True)
class Param:
    name: str
    where: Literal["query", "header"]
    schema: dict[str, Any]
    description: str


@dataclass(frozen=True)
class Reply:
    description: str
    body: Any = None  # a type pydantic describes (TypedDict, model), answered as application/json
    content: dict[str, dict[str, Any]] | None = None  # other media types: media type -> schema
    headers: dict[str, dict[str, Any]] = field(default_factory=dict)  # header -> schema


@dataclass(frozen=True)
class Operation:
    summary: str
    tag: str
    role: Role  # admin: the admin token only; read: either token; open: no token
    replies: dict[int, Reply]
    description: str = ""
    params: tuple[Param, ...] = ()
    body: type | None = None  # a pydantic model: the JSON body it validates
    body_required: bool = False
    errors: dict[int, str] = field(default_factory=dict)  # beyond those every operation of its kind has


_EXPORT_HEADERS: dict[str, dict[str, Any]] = {
    "X-Polar-Sessions": {"type": "integer", "minimum": 0},
    "X-Polar-Accepted": {"type": "integer", "minimum": 0},
    "X-Polar-Acceptance-Rate": {"type": "number", "minimum": 0, "maximum": 1},
    "X-Polar-Rows": {"type": "integer", "minimum": 0},
    "X-Polar-Tokens": {"type": "integer", "minimum": 0},
    "Content-Disposition": {"type": "string"},
}
_PAGE = (
    Param("limit", "query", SESSIONS_LIMIT.schema(), "Sessions per page."),
    Param("offset", "query", SESSIONS_OFFSET.schema(), "Sessions to skip (a page's ``next_offset``)."),
    Param("after", "query", {"type": "string", "pattern": r"^[0-9]{1,9}\.[0-9]{1,9}\.[0-9]{1,9}$"},
          "Sessions after this cursor (a page's ``next_after``): as fast at any depth of the batch."),
)  # fmt: skip
_CALL_PAGE = (
    Param("limit", "query", CALLS_LIMIT.schema(), "Calls per page."),
    Param("after", "query", CALLS_AFTER.schema(), "Calls after this ``seq`` (a page's ``next_after``)."),
)
_FEED = (
    Param("batch_id", "query", {"type": "string", "format": "uuid"}, "Only this batch's trajectories."),
    Param("after", "query", FEED_AFTER.schema(), "The cursor: the ``next_cursor`` of the previous page."),
    Param("limit", "query", FEED_LIMIT.schema(), "Sessions (or groups) per page."),
    Param("wait", "query", {"type": "number", "minimum": 0, "maximum": MAX_WAIT_S, "default": 0},
          "Seconds to long-poll while nothing is past the cursor."),
    Param("groups", "query", {"type": "string", "pattern": "^([Tt][Rr][Uu][Ee]|[Ff][Aa][Ll][Ss][Ee]|1|0)$",
                              "default": "false"},
          "true: only whole groups (all samples of a task settled), in the order they completed."),
    Param("informative", "query", {"type": "string", "pattern": "^([Tt][Rr][Uu][Ee]|[Ff][Aa][Ll][Ss][Ee]|1|0)$",
                                   "default": "false"},
          "true: whole groups (as groups=true) without those whose scored samples' rewards are all equal (zero "
          "advantage); the page counts them in skipped_uninformative."),
)  # fmt: skip
_IDEMPOTENCY_KEY = Param(
    "Idempotency-Key", "header", {"type": "string", "minLength": 1, "maxLength": MAX_IDEMPOTENCY_KEY},
    "Replaying the same key with the same body returns the first batch instead of a new one.",
)  # fmt: skip
_EXPORT = (
    Param("kind", "query", {"type": "string", "enum": list(KINDS), "default": "rl"},
          "rl: one row per trajectory; sft: one conversation per accepted session."),
    Param("format", "query", {"type": "string", "enum": list(FORMATS), "default": "jsonl"}, "The file format."),
    Param("min_reward", "query", {"type": "number"}, "Keep sessions with reward >= this."),
)  # fmt: skip

OPERATIONS: dict[str, Operation] = {
    "batches.create": Operation(
        "Submit a batch",
        "batches",
        "admin",
        {
            201: Reply("Created: every task's ``num_samples`` sessions are pending.", SubmittedJSON),
            200: Reply("A replay of an ``Idempotency-Key``: the batch the first request created.", SubmittedJSON),
        },
        description="Validated whole before anything is written; a 400 names the first bad field, e.g. "
        "``tasks[0].harness.name``. ``defaults`` (any TaskRequest fields) are merged under every task.",
        params=(_IDEMPOTENCY_KEY,),
        body=BatchRequest,
        body_required=True,
        errors={409: "The Idempotency-Key was already used with a different body."},
    ),
    "batches.show": Operation(
        "A batch's progress", "batches", "read", {200: Reply("Counts per state, each sample once.", BatchJSON)}
    ),
    "batches.sessions": Operation(
        "A batch's sessions, a page at a time",
        "batches",
        "read",
        {200: Reply("In task order, then sample, then attempt.", SessionPageJSON)},
        params=_PAGE,
    ),
    "batches.cancel": Operation(
        "Cancel a batch",
        "batches",
        "admin",
        {202: Reply("Unstarted sessions end cancelled; started ones go through postrun.", CancelledJSON)},
    ),
    "exports.export": Operation(
        "Download a batch as training data",
        "batches",
        "read",
        {
            200: Reply(
                "The file, streamed; its counts in X-Polar-* headers.",
                content={
                    MEDIA_TYPES["jsonl"]: {"type": "string"},
                    MEDIA_TYPES["parquet"]: {"type": "string", "contentEncoding": "binary"},
                },
                headers=_EXPORT_HEADERS,
            )
        },
        params=_EXPORT,
    ),
    "media.image": Operation(
        "An image a captured call sent",
        "feed",
        "read",
        {
            200: Reply(
                "The image's bytes, with its media type.",
                content={
                    t: {"type": "string", "contentEncoding": "binary"}
                    for t in ("image/png", "image/jpeg", "image/gif", "image/webp")
                },
            )
        },
        description="By the sha256 a trajectory's, call's or export row's ``media`` names (docs/training-data.md).",
        errors={400: "The sha256 is not 64 lower-case hex digits."},
    ),
    "sessions.show": Operation("One session", "sessions", "read", {200: Reply("The session.", SessionJSON)}),
    "sessions.events": Operation(
        "A session's state changes",
        "sessions",
        "read",
        {200: Reply("Every state change, with the time spent in the state it entered.", SessionEventsJSON)},
    ),
    "sessions.calls": Operation(
        "A session's captured model calls, a page at a time",
        "sessions",
        "read",
        {200: Reply("In ``seq`` order, each whole: its full prompt and payloads.", CallPageJSON)},
        params=_CALL_PAGE,
    ),
    "sessions.trajectories": Operation(
        "A session's reconstructed trajectories", "sessions", "read", {200: Reply("In order.", TrajectoriesJSON)}
    ),
    "trajectories.feed": Operation(
        "The trainers' feed",
        "feed",
        "read",
        {200: Reply("Trajectories of sessions that finished after the cursor.", FeedPageJSON)},
        description="Long-polls up to ``wait`` seconds until finished sessions (or whole groups) exist past "
        "``after``; an empty page keeps the cursor.",
        params=_FEED,
        errors={
            404: "``batch_id`` is not a batch id.",
            429: "This API process already holds as many long-polls as it may (POLAR_FEED_MAX_WAITERS).",
        },
    ),
    "engine.show": Operation("The engine's pause state", "engine", "read", {200: Reply("", EngineStateJSON)}),
    "engine.pause": Operation(
        "Hold new model calls",
        "engine",
        "admin",
        {200: Reply("Paused; returned once every proxy has seen it and every engine answered.", EngineControlJSON)},
        description="While a trainer syncs weights: new calls get 429 + Retry-After (``reject``) or wait "
        "(``wait``) at the proxies; every engine is paused too (``engine_mode``: ``keep`` freezes calls in flight "
        "until resume, ``wait`` lets them finish first, ``abort`` ends them, ``none`` leaves engines alone). "
        "Each engine's outcome is in ``engines``.",
        body=PauseRequest,
    ),
    "engine.resume": Operation(
        "Let model calls through again",
        "engine",
        "admin",
        {200: Reply("Resumed: the new policy version is recorded, then every engine continues.", EngineControlJSON)},
        description="Calls an engine held across the update end under the new version and are marked "
        "``spans_policy_update``.",
        body=ResumeRequest,
    ),
    "engines.listing": Operation(
        "The inference engines",
        "engine",
        "read",
        {200: Reply("Every engine, probed now: kind, health, load, versions.", EnginesJSON)},
    ),
    "engines.add": Operation(
        "Add an engine at run time",
        "engine",
        "admin",
        {201: Reply("Added: proxies send it new sessions within a health round.", EngineChangeJSON)},
        body=EngineRequest,
        body_required=True,
    ),
    "engines.drain": Operation(
        "Drain an engine added at run time",
        "engine",
        "admin",
        {200: Reply("Drained: no new sessions; its sessions move on their next call.", EngineChangeJSON)},
        body=EngineRequest,
        body_required=True,
        errors={404: "The engine was not added through the API."},
    ),
    "health.healthz": Operation(
        "Liveness",
        "service",
        "open",
        {200: Reply("The database answers.", HealthJSON), 503: Reply("The database does not answer.", HealthJSON)},
    ),
    "metrics.prometheus": Operation(
        "Prometheus metrics",
        "service",
        "read",
        {200: Reply("The text exposition format (docs/metrics.md).", content={"text/plain": {"type": "string"}})},
        description="Open without a token when POLAR_METRICS_PUBLIC=true.",
    ),
    "openapi.document": Operation(
        "This description",
        "service",
        "open",
        {200: Reply("OpenAPI 3.1.", content={"application/json": {"type": "object"}})},
    ),
}
