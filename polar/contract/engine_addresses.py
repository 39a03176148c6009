"""Where an engine is and which protocol it speaks, as ``POLAR_ENGINE_URLS`` and ``POST /v1/engines`` write it:
``http://h:p`` (or ``vllm+http://``) is vLLM's protocol, ``sglang+http://h:p`` SGLang's native one. Parsing only, so
that the configuration and the API can check a URL without loading the proxy."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from polar.codec.redaction import shown_url
from polar.errors import ValidationError

EngineKind = Literal["vllm", "sglang"]
KINDS: tuple[EngineKind, ...] = ("vllm", "sglang")
# How each kind is written in an engine URL, and where its server says its version (the rest of what a kind means
# is its backend module, polar.fleet.backends).
_PREFIXES: dict[EngineKind, str] = {"vllm": "", "sglang": "sglang+"}
_VERSION_PATHS: dict[EngineKind, str] = {"vllm": "/version", "sglang": "/get_server_info"}


@dataclass(frozen=True)
class EngineAddress:
    url: str  # the base URL requests go to (no kind prefix, no trailing slash)
    kind: EngineKind


_PORT = r"(?:[0-9]{1,4}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])"
_URL_TEXT = r"[A-Za-z0-9._~%!$&'()*+,;=:-]"
# The whole grammar of an engine URL: an optional kind, http(s), optional user info (an engine's credentials,
# never shown), a host name or IPv4 address, an optional port, path and query. The API's schema carries the same
# pattern, so what it calls valid is what this accepts. No IPv6 literals: a regular expression cannot tell a valid
# one from `[::::]`; an IPv6 engine is named by a host name.
_HOST = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*"
ENGINE_URL_PATTERN = (
    rf"^(?:(?:vllm|sglang)\+)?https?://(?:{_URL_TEXT}+@)?{_HOST}(?::{_PORT})?"
    rf"(?:/(?:{_URL_TEXT}|[/@])*)?(?:\?(?:{_URL_TEXT}|[/?@])*)?$"
)
_ENGINE_URL = re.compile(ENGINE_URL_PATTERN)


def parse_engine_url(raw: str) -> EngineAddress:
    """``sglang+http://h:p`` → (``http://h:p``, sglang); ``http://h:p`` and ``vllm+http://h:p`` → vllm."""
    text = raw  # as given: POLAR_ENGINE_URLS entries come stripped, API bodies must match the schema as sent
    if not _ENGINE_URL.fullmatch(text):
        raise ValidationError(
            f"engine URL {shown_url(text)[:200]!r}: use http(s)://host:port (vLLM) or sglang+http(s)://host:port "
            "(SGLang)",
            field="url",
        )
    kind, plus, rest = text.rstrip("/").partition("+")
    if plus:
        return EngineAddress(rest, kind)  # type: ignore[arg-type]
    return EngineAddress(text.rstrip("/"), "vllm")


def engine_label(address: EngineAddress) -> str:
    """How an engine is written in ``POLAR_ENGINE_URLS``: its URL, prefixed with its kind unless vLLM."""
    return _PREFIXES[address.kind] + address.url


def version_path(address: EngineAddress) -> str:
    """Where the engine at ``address`` says its version (``{"version": ...}``)."""
    return _VERSION_PATHS[address.kind]
