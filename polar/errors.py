"""Polar's exception tree.

    PolarError
    ├── ValidationError        bad input from a caller (maps to 400)
    ├── NotFound               an id that does not exist (404)
    ├── Conflict               an idempotency key reused with another body (409)
    ├── Unauthorized           missing or unknown token / proxy key (401)
    ├── SessionNotRunning      a proxy key whose session no longer accepts calls (401)
    ├── EnginePaused           model calls are held while a trainer syncs weights (429)
    ├── EngineError            the inference engine failed (502)
    │   └── EngineTimeout      the inference engine did not answer in time (504)
    ├── CaptureFailed          a call could not be recorded, so its answer is withheld (503)
    ├── BrokerUnavailable      the message broker did not take a stage message (it stays due in the outbox)
    ├── RuntimeFailure         a runtime could not be created or a command could not start
    └── EvaluationError        an evaluator raised; the session is marked failed

Foreign exceptions are translated where they enter Polar (``raise ... from exc``); callers catch only these.
"""

from __future__ import annotations


class PolarError(Exception):
    """Base of every error Polar raises on purpose."""


class ValidationError(PolarError):
    """Input that does not fit the contract; ``field`` names the offending field when known."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


class NotFound(PolarError):
    """A batch, session or other id that does not exist."""


class Conflict(PolarError):
    """A request that contradicts an earlier one (an idempotency key reused with another body)."""


class Unauthorized(PolarError):
    """A missing or unknown bearer token or proxy key."""


class SessionNotRunning(PolarError):
    """A proxy key whose session has left the running state."""


class EnginePaused(PolarError):
    """Model calls are held (``POST /v1/engine/pause``); retry after ``retry_after_s``."""

    def __init__(self, message: str, retry_after_s: int = 2) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class EngineError(PolarError):
    """The inference engine refused, failed or returned something unusable."""

    def __init__(self, message: str, status_code: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status_code = status_code


class EngineTimeout(EngineError):
    """The inference engine did not answer within the proxy's timeout."""


class CaptureFailed(PolarError):
    """The database stayed unreachable longer than Polar waits: the engine's answer is not sent, because an
    answer the harness received must always be in the database."""


class BrokerUnavailable(PolarError):
    """The message broker could not be reached to send a stage message; the outbox keeps it due."""


class RuntimeFailure(PolarError):
    """A runtime could not be created, reached or used."""


class EvaluationError(PolarError):
    """An evaluator raised or returned something invalid."""
