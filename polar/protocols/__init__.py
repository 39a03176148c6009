"""Client protocols the proxy speaks: one module each, all with the same functions (see ``_base``).

``detect`` picks the module for a request: by path first, then by headers (``GET /v1/models`` is both
OpenAI's and Anthropic's), then by the body's shape for paths no protocol claims.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from http import HTTPStatus
from types import ModuleType
from typing import Any

from polar.protocols import anthropic, gemini, openai_chat, openai_responses
from polar.protocols._base import (
    ClientRequest,
    EngineAnswer,
    Operation,
    RequestContext,
    continued_answer,
    without_routed_experts,
)

PROTOCOLS: dict[str, ModuleType] = {
    module.PROVIDER: module for module in (openai_chat, anthropic, openai_responses, gemini)
}

__all__ = [
    "PROTOCOLS",
    "ClientRequest",
    "Detected",
    "EngineAnswer",
    "Operation",
    "RequestContext",
    "continued_answer",
    "detect",
    "protocol_for_errors",
    "refusal_answer",
    "without_routed_experts",
]

# Headers only one provider's clients send, used to settle paths several protocols share.
_HEADER_HINTS = (("anthropic-version", "anthropic"), ("x-goog-api-key", "gemini"))


@dataclass(frozen=True)
class Detected:
    protocol: ModuleType
    operation: Operation
    context: RequestContext


def _by_header(candidates: list[tuple[ModuleType, Any]], headers: Mapping[str, str]) -> tuple[ModuleType, Any]:
    for header, provider in _HEADER_HINTS:
        if header in headers:
            for candidate in candidates:
                if provider == candidate[0].PROVIDER:
                    return candidate
    return candidates[0]


def _by_body(body: Any) -> ModuleType | None:
    if not isinstance(body, dict):
        return None
    shapes = (("contents", "gemini"), ("input", "openai_responses"), ("max_tokens", "anthropic"),
              ("messages", "openai_chat"))  # fmt: skip
    for key, provider in shapes:
        if key in body and provider in PROTOCOLS:
            return PROTOCOLS[provider]
    return None


def detect(
    method: str, path: str, headers: Mapping[str, str], query: Mapping[str, str], body: Any = None
) -> Detected | None:
    """The protocol and operation for a request below the session base URL (query strings are ignored)."""
    path = "/" + path.strip("/")
    candidates = []
    for module in PROTOCOLS.values():
        for known in module.ROUTES:
            if known.method == method.upper() and (match := known.pattern.fullmatch(path)):
                candidates.append((module, known, match.groupdict()))
    if candidates:
        module, known, params = _by_header([(c[0], c) for c in candidates], headers)[1]
        return Detected(module, known.operation, RequestContext(params, query, headers, known.stream))
    if method.upper() == "POST" and (module := _by_body(body)) is not None:
        return Detected(module, "generate", RequestContext({}, query, headers, None))
    return None


# Path fragments that say which provider's client is calling, for requests no route matches.
_PATH_HINTS = ((":generatecontent", "gemini"), (":streamgeneratecontent", "gemini"), ("/v1beta/", "gemini"),
               (":embedcontent", "gemini"), ("/messages", "anthropic"), ("/responses", "openai_responses"))  # fmt: skip


def protocol_for_errors(path: str, headers: Mapping[str, str]) -> ModuleType:
    """The protocol whose error shape best fits a request that matched no route (or failed before routing)."""
    for header, provider in _HEADER_HINTS:
        if header in headers and provider in PROTOCOLS:
            return PROTOCOLS[provider]
    lowered = path.lower()
    for fragment, provider in _PATH_HINTS:
        if fragment in lowered and provider in PROTOCOLS:
            return PROTOCOLS[provider]
    return openai_chat


def refusal_answer(status: int, reason: str, path: str, fields: list[tuple[str, str]]) -> bytes:
    """A refusal as a whole HTTP/1.1 answer that closes the connection, in the error shape of the protocol the
    request names (``protocol_for_errors`` of its path and header fields): the proxy's server and the sandbox
    relay answer a request they will not frame with these same bytes."""
    headers = {name.lower(): value for name, value in fields}
    body = json.dumps(protocol_for_errors(path, headers).render_error(status, reason)).encode()
    phrase = HTTPStatus(status).phrase.encode() if status in HTTPStatus._value2member_map_ else b"Refused"
    return b"HTTP/1.1 %d %b\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%b" % (
        status,
        phrase,
        len(body),
        body,
    )
