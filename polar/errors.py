"""Polar's exception tree.

    PolarError
    ├── ValidationError        bad input from a caller (maps to 400)
    │   └── PluginNotAllowed   an import path outside the operator's POLAR_PLUGIN_MODULES
    ├── NotFound               an id that does not exist (404)
    ├── Conflict               an idempotency key reused with another body (409)
    ├── Unauthorized           missing or unknown token / proxy key (401)
    ├── Forbidden              a known token whose role may not do this (the read-only token starting work; 403)
    ├── SessionNotRunning      a proxy key whose session no longer accepts calls (401)
    ├── EnginePaused           model calls are held while a trainer syncs weights (429)
    ├── TooManyCalls           a session went over its concurrent, total or count-tokens call limit (429)
    ├── EngineError            the inference engine failed (502)
    │   └── EngineTimeout      the inference engine did not answer in time (504)
    ├── Busy                   too many long-polls wait, or unknown keys arrive, in this process (429, Retry-After)
    ├── CaptureFailed          a call could not be recorded, so its answer is withheld (503)
    ├── BrokerUnavailable      the message broker did not take a stage message (it stays due in the outbox)
    ├── RuntimeFailure         a runtime could not be created or a command could not start
    ├── UnsafePath             a link, special file or escape in a session directory, refused by the host
    └── EvaluationError        the work left nothing to judge or broke its judging; scored the failure reward

Foreign exceptions are translated where they enter Polar (``raise ... from exc``); callers catch only these.
"""

from __future__ import annotations

from typing import Any


class PolarError(Exception):
    """Base of every error Polar raises on purpose."""


class ValidationError(PolarError):
    """Input that does not fit the contract; ``field`` names the offending field when known."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


class PluginNotAllowed(ValidationError):
    """An import path (evaluator, engine policy, ``python`` harness) whose module is not under the operator's
    allow-list, ``POLAR_PLUGIN_MODULES``: refused before anything is imported."""


class Busy(PolarError):
    """This process already holds as many long-polls as it may (``wait`` on the feed), or a proxy is holding back
    the lookups of keys it does not know (``polar.proxy.key_misses``); retry after ``retry_after_s``."""

    def __init__(self, message: str, retry_after_s: int = 1) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class NotFound(PolarError):
    """A batch, session or other id that does not exist."""


class Conflict(PolarError):
    """A request that contradicts an earlier one (an idempotency key reused with another body)."""


class Unauthorized(PolarError):
    """A missing or unknown bearer token or proxy key."""


class Forbidden(PolarError):
    """A known token whose role does not allow the request (the read-only token asking to start or change work)."""


class SessionNotRunning(PolarError):
    """A proxy key whose session has left the running state."""


class EnginePaused(PolarError):
    """Model calls are held (``POST /v1/engine/pause``); retry after ``retry_after_s``."""

    def __init__(self, message: str, retry_after_s: int = 2) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class TooManyCalls(PolarError):
    """A session is over its call limits (``max_concurrent_calls`` / ``max_calls`` / ``max_count_tokens``, named by
    ``limit``): ``retry_after_s`` when a call in flight will free a slot, None when the session has made all the
    calls of that kind it may."""

    def __init__(self, message: str, retry_after_s: int | None = None, limit: str = "max_calls") -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
        self.limit = limit


# Why the engine failed a call, as ``model_calls.failure_kind`` records it: no engine reachable (refused, or the
# connection dropped), an engine 5xx or unusable answer, a timeout while the engine was unhealthy or had requests
# queued, or a timeout while it was healthy with nothing queued: it was generating this very call (the policy's
# doing, ``polar.lifecycle.attempts``).
UNREACHABLE = "unreachable"
ENGINE_ERROR = "engine_error"
ENGINE_TIMEOUT = "engine_timeout"
GENERATION_TIMEOUT = "generation_timeout"


class EngineError(PolarError):
    """The inference engine refused, failed or returned something unusable; ``failure_kind`` says which way."""

    default_kind = ENGINE_ERROR

    def __init__(self, message: str, status_code: int | None = None, failure_kind: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status_code = status_code
        self.failure_kind = failure_kind or self.default_kind


class EngineTimeout(EngineError):
    """The inference engine did not answer within the proxy's timeout (``engine_timeout``, or
    ``generation_timeout`` when it was healthy and generating the call)."""

    default_kind = ENGINE_TIMEOUT


class CaptureFailed(PolarError):
    """The database stayed unreachable longer than Polar waits: the engine's answer is not sent, because an
    answer the harness received must always be in the database."""


class BrokerUnavailable(PolarError):
    """The message broker could not be reached to send a stage message; the outbox keeps it due."""


class RuntimeFailure(PolarError):
    """A runtime could not be created, reached or used."""


class UnsafePath(PolarError):
    """A path in a session directory the host will not touch: a symbolic link on the way (the session made it and
    it may point anywhere on the host), a FIFO, device or socket where a file belongs, a hard link to write
    through, or a path leaving the directory. The step that needed it fails; nothing outside is touched."""


class EvaluationError(PolarError):
    """The work under judgement left nothing to score, or broke its judging: no reward file or one that holds no
    number, a verifier that ran out of its time, a command that printed no score. The session is the policy's
    failure and scores its task's ``failure_reward`` (never None). ``details`` (what the judging saw) are stored
    with it. A bug in the evaluator's own code is any other exception: the attempt is ``unscorable`` and retried."""

    def __init__(self, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.details = dict(details or {})


# The HTTP status each error answers with, in every protocol Polar serves (the rollout API, the console, the proxy's
# provider shapes); a subclass before its base. An error that carries its own status (an engine's) keeps it.
HTTP_STATUS: dict[type[PolarError], int] = {
    ValidationError: 400,
    Unauthorized: 401,
    SessionNotRunning: 401,
    Forbidden: 403,
    NotFound: 404,
    Conflict: 409,
    EnginePaused: 429,
    TooManyCalls: 429,
    Busy: 429,
    EngineTimeout: 504,
    EngineError: 502,
    CaptureFailed: 503,
}


def http_status(exc: PolarError) -> int:
    """The status ``exc`` answers with: its own when it carries one, else ``HTTP_STATUS``'s, else 500."""
    own = getattr(exc, "status_code", None)
    if own:
        return int(own)
    return next((code for kind, code in HTTP_STATUS.items() if isinstance(exc, kind)), 500)
