"""How large a request body the proxy takes, per protocol, and how much memory parsing one may cost.

Bytes: each protocol's cap is its provider's own documented request limit (a client written for that provider
never sends more), never above ``POLAR_MAX_BODY_BYTES``. A larger ``Content-Length`` is refused (413, in the
protocol's shape) before any of the body is read; a chunked body is read only up to the cap. A count-tokens call
(Anthropic's ``count_tokens``, Gemini's ``countTokens``, OpenAI's ``input_tokens``) is capped far lower, at
``POLAR_MAX_COUNT_TOKENS_BYTES`` (4 MiB: a text conversation of about a million tokens): the engine tokenises its body
whole in its API server, beside every other session's calls, for an answer of one number.

Memory: Python's JSON parser grows memory up to about 24 times the body for bodies of tiny values
(``[{},{},…]``: 3 bytes become a 64-byte dict and an 8-byte pointer). So a body is also refused (413) when it
holds more than ``POLAR_MAX_JSON_VALUES`` values, counted as its ``{``, ``[`` and ``,`` bytes (an upper bound: those
inside strings count too) before it is parsed. Parsing a body of ``n`` bytes and ``v`` such values then grows
memory by at most ``8 n + 160 v`` bytes (the body is decoded to text whole, then its strings are made, each at
most 4 bytes a character; every other value with its container slot under 160 bytes), checked in
tests/polar/proxy/test_body_limits.py; at the defaults (32 MiB, 1,000,000 values) under 420 MiB per body. A
session reads and parses at most ``max_concurrent_calls`` bodies at once (``ProxyService`` does so only under one
of its slots).
"""

from __future__ import annotations

from types import ModuleType

from polar.config import Config
from polar.errors import PolarError

MIB = 1024 * 1024
# The providers' documented request size limits: Anthropic's Messages API 32 MB, Gemini's inline requests 20 MB,
# OpenAI's 32 MiB here too (its API states no lower one for text).
PROTOCOL_BYTES = {"anthropic": 32 * MIB, "gemini": 20 * MIB, "openai_chat": 32 * MIB, "openai_responses": 32 * MIB}
VALUE_BYTES = b"{[,"
FOR_THIS_API = "for this API"
FOR_COUNT_TOKENS = "for counting tokens (POLAR_MAX_COUNT_TOKENS_BYTES)"


class BodyTooLarge(PolarError):
    """A body over its protocol's cap, in bytes or in values (413)."""

    status_code = 413


def body_cap(protocol: ModuleType, deployment_cap: int) -> int:
    """The most bytes a body in ``protocol`` may have."""
    return min(PROTOCOL_BYTES.get(protocol.PROVIDER, deployment_cap), deployment_cap)


def request_cap(protocol: ModuleType, operation: str, config: Config) -> tuple[int, str]:
    """The most bytes a body of ``operation`` in ``protocol`` may have, and which limit that is (for the 413)."""
    cap = body_cap(protocol, config.max_body_bytes)
    if operation == "count_tokens" and config.max_count_tokens_bytes < cap:
        return config.max_count_tokens_bytes, FOR_COUNT_TOKENS
    return cap, FOR_THIS_API


def check_length(length: int | None, cap: int, what: str = FOR_THIS_API) -> None:
    if length is not None and length > cap:
        raise BodyTooLarge(f"request body of {length} bytes is over this proxy's {cap}-byte limit {what}")


def check_values(raw: bytes, max_values: int) -> None:
    """Refuse a body that would parse into more than ``max_values`` values, before it is parsed."""
    if len(raw) <= max_values:  # fewer bytes than that cannot hold more (~0.2 ms saved on a 200 KB body)
        return
    count = 0
    for byte in VALUE_BYTES:
        count += raw.count(byte)
        if count > max_values:
            raise BodyTooLarge(
                f"request body holds more than {max_values} JSON values (objects, arrays and list items); "
                "this proxy parses no more"
            )
