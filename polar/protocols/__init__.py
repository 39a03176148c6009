"""Client protocols the proxy speaks: one module each, all with the same functions (see ``_base``).

``ROUTES`` maps a request path (below the session base URL) to the protocol module that serves it.
"""

from __future__ import annotations

from types import ModuleType

from polar.protocols import openai_chat
from polar.protocols._base import ClientRequest, EngineAnswer

PROTOCOLS: dict[str, ModuleType] = {openai_chat.PROVIDER: openai_chat}

# (method, path) -> (protocol, operation)
ROUTES: dict[tuple[str, str], tuple[ModuleType, str]] = {
    ("POST", "/v1/chat/completions"): (openai_chat, "generate"),
    ("GET", "/v1/models"): (openai_chat, "models"),
}

__all__ = ["PROTOCOLS", "ROUTES", "ClientRequest", "EngineAnswer", "route"]


def route(method: str, path: str) -> tuple[ModuleType, str] | None:
    """The protocol and operation for ``path``; clients' query strings (``?beta=true``) are ignored."""
    return ROUTES.get((method.upper(), "/" + path.strip("/")))
