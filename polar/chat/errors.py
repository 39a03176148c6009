"""Errors the reference engine raises; the server turns each into vLLM's error body.

    ValueError
     └── EngineRequestError        a client sent something the engine cannot serve (HTTP 400)
          ├── MessageFormatError   a chat message the template cannot render
          ├── ContextLengthError   the prompt does not fit in max_model_len
          └── EngineNotFoundError  an unknown route or model (HTTP 404)

They derive from ValueError so callers outside the engine can treat bad input uniformly.
"""

from __future__ import annotations

from polar.errors import PolarError


class EngineRequestError(PolarError, ValueError):
    """A request the engine rejects with HTTP 400, as vLLM's BadRequestError."""

    status: int = 400
    error_type: str = "BadRequestError"

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class MessageFormatError(EngineRequestError):
    """A chat message (role, content part, tool call) the chat template cannot render."""


class ContextLengthError(EngineRequestError):
    """The prompt plus the requested output does not fit in the model's context."""


class EngineNotFoundError(EngineRequestError):
    """An unknown route or model name (HTTP 404)."""

    status = 404
    error_type = "NotFoundError"
