"""Where a model call names its session's proxy key: the base URL's ``/s/<key>`` (optionally ``/s/<key>/a/<agent>``)
or, on un-prefixed paths, any provider's API-key field (``Authorization: Bearer``, ``x-api-key``,
``x-goog-api-key``, ``?key=``), in that order. The proxy and the sandbox relay (which refuses any key that is not
its own session's) read it with these same functions, so they cannot disagree on whose call it is."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from urllib.parse import parse_qsl

KEY_HEADERS = ("x-api-key", "x-goog-api-key")


def hash_key(key: str) -> str:
    """A proxy key's sha256, as it is stored and compared (the key itself is never kept)."""
    return hashlib.sha256(key.encode()).hexdigest()


def route(path_info: str) -> tuple[str | None, str | None, str]:
    """(key, agent, path below them) of a request path: ``/s/<key>/a/<agent>/<path>``, ``/s/<key>/<path>`` or
    ``/<path>``; a doubled slash after the base (a base URL configured with a trailing slash) counts as one."""
    if path_info.startswith("/s/"):
        key, slash, rest = path_info[3:].partition("/")
        if key and slash:
            if rest.startswith("a/"):
                agent, slash, below = rest[2:].partition("/")
                if agent and slash:
                    return key, agent, below.lstrip("/")
            return key, None, rest.lstrip("/")
    return None, None, path_info.lstrip("/")


def first_args(query: str) -> dict[str, str]:
    """A query string's first value of each name (blank values kept)."""
    args: dict[str, str] = {}
    for name, value in parse_qsl(query, keep_blank_values=True):
        args.setdefault(name, value)
    return args


def api_key(headers: Mapping[str, str], args: Mapping[str, str]) -> str | None:
    """The key a request carries as a provider's API key (header fields by lower-case name, query's first values)."""
    bearer = headers.get("authorization", "")
    if bearer.lower().startswith("bearer "):
        return bearer[7:].strip() or None
    for header in KEY_HEADERS:
        if headers.get(header):
            return headers[header]
    return args.get("key")


def request_key(path_info: str, headers: Mapping[str, str], query: str) -> str | None:
    """The proxy key of a request: its path's, else its API-key field's; None when it carries none."""
    key, _, _ = route(path_info)
    return key or api_key(headers, first_args(query))
