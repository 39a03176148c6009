"""Values shared by the protocol modules. Each module (``openai_chat``, …) exposes the same functions:

- ``normalize(body) -> ClientRequest``: the client's request in the OpenAI chat shape the engine takes;
- ``render_response(request, answer) -> dict``: the engine's answer in the client's protocol;
- ``render_stream(request, answer) -> Iterator[bytes]``: the same answer as the protocol's event stream;
- ``render_error(status, message) -> dict``: an error body in the protocol's own shape.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ClientRequest:
    """A client's call, normalised: ``engine_body`` is an OpenAI chat request (no capture fields yet)."""

    provider: str
    engine_body: dict[str, Any]
    stream: bool
    model: str | None
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class EngineAnswer:
    """The engine's chat completion (vLLM shape, with ``prompt_token_ids`` and per-choice ``token_ids``)."""

    body: dict[str, Any]

    @property
    def choice(self) -> dict[str, Any]:
        return self.body["choices"][0]  # type: ignore[no-any-return]

    @property
    def prompt_token_ids(self) -> list[int]:
        return list(self.body.get("prompt_token_ids") or [])

    @property
    def completion_token_ids(self) -> list[int]:
        return list(self.choice.get("token_ids") or [])

    @property
    def logprobs(self) -> list[float]:
        content = (self.choice.get("logprobs") or {}).get("content") or []
        return [float(entry["logprob"]) for entry in content]

    @property
    def finish_reason(self) -> str | None:
        return self.choice.get("finish_reason")  # type: ignore[no-any-return]


def sse(data: Mapping[str, Any] | str, event: str | None = None) -> bytes:
    """One server-sent event."""
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    prefix = f"event: {event}\n" if event else ""
    return f"{prefix}data: {payload}\n\n".encode()
