"""One model call through the proxy: what it is recorded with (``ProxyCall``) and what the web shell sends back
(``ProxyAnswer``)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from polar.protocols import ClientRequest


@dataclass(frozen=True)
class ProxyAnswer:
    status: int
    body: dict[str, Any] | None = None
    stream: Iterator[bytes] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    media_type: str = "application/json"
    call_id: uuid.UUID | None = None  # the captured call this answers (its delivery is tracked)


@dataclass(frozen=True)
class ProxyCall:
    """One call's context, as it is recorded: whose, what the client sent, when it started, under which policy."""

    session_id: uuid.UUID
    agent: str | None
    request: ClientRequest
    body: Any
    started: float
    policy_version: str | None
    sampling_mode: str = "record"  # the task's ``sampling`` (polar.proxy.sampling)
    keep_s: int = 3600  # how long the session's call state is kept after a call (CallLimits.keep_s)
    size: int = 0  # the request body's bytes
