"""Parsing a body costs the proxy a bounded amount of memory: a 32 MiB body of tiny values is refused before it is
parsed, and what is parsed stays under the documented ``8 n + 160 v`` bytes (``polar.proxy.body_limits``)."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest

from polar.codec.json_body import parse_json
from polar.config import load_config
from polar.protocols import anthropic, gemini, openai_chat
from polar.proxy.body_limits import MIB, BodyTooLarge, body_cap, check_length, check_values, request_cap

VALUES = 1_000_000  # the deployment default


def peak_growth(work: Callable[[], object]) -> int:
    """The most memory ``work`` had allocated at once, in bytes (what it returns is kept until it is measured)."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base, _ = tracemalloc.get_traced_memory()
        kept = work()
        _, peak = tracemalloc.get_traced_memory()
        del kept
        return peak - base
    finally:
        tracemalloc.stop()


def parsed(raw: bytes) -> object:
    check_values(raw, VALUES)
    return parse_json(raw)


def values_in(raw: bytes) -> int:
    return sum(raw.count(byte) for byte in b"{[,")


def test_a_32_mib_body_of_tiny_values_is_refused_before_it_is_parsed() -> None:
    raw = b'{"model":"m","messages":[' + b"{}," * (32 * MIB // 3 - 20) + b"{}]}"
    assert len(raw) <= 32 * MIB

    def refused() -> None:
        with pytest.raises(BodyTooLarge, match="JSON values"):
            parsed(raw)

    # Counting allocates nothing; unchecked, parsing this body grows memory by 810 MiB.
    assert peak_growth(refused) < MIB


@pytest.mark.parametrize(
    "shape",
    [
        lambda n: b"[" + b"{}," * (n - 1) + b"{}]",  # the most memory per byte: a dict per 3 bytes
        lambda n: b"[" + b"[]," * (n - 1) + b"[]]",
        lambda n: b"{" + b",".join(b'"k%07d":1.5' % i for i in range(n)) + b"}",  # distinct keys, floats
        lambda n: b'["' + ("\U0001f600" + "x" * 200).encode() * (n // 8) + b'"]',  # one string, 4 bytes a character
    ],
    ids=["dicts", "lists", "keys", "wide-string"],
)
def test_what_is_parsed_stays_under_the_documented_bound(shape: Callable[[int], bytes]) -> None:
    raw = shape(VALUES // 4)  # a quarter of the default cap keeps the test quick; the bound is per value and byte
    bound = 8 * len(raw) + 160 * values_in(raw)
    assert peak_growth(lambda: parsed(raw)) <= bound


def test_each_protocol_has_its_providers_cap_never_above_the_deployments() -> None:
    assert body_cap(gemini, 32 * MIB) == 20 * MIB
    assert body_cap(anthropic, 32 * MIB) == body_cap(openai_chat, 32 * MIB) == 32 * MIB
    assert body_cap(anthropic, 1000) == 1000


def test_counting_tokens_has_a_cap_of_its_own_far_below_the_generation_cap(tmp_path: Path) -> None:
    """Audit G10: a count-tokens body is tokenised whole by the engine for one number; its cap is 4 MiB."""
    config = load_config({}, cwd=tmp_path)
    assert request_cap(anthropic, "generate", config) == (32 * MIB, "for this API")
    cap, what = request_cap(anthropic, "count_tokens", config)
    assert cap == request_cap(gemini, "count_tokens", config)[0] == 4 * MIB
    with pytest.raises(BodyTooLarge) as refused:
        check_length(cap + 1, cap, what)
    assert refused.value.status_code == 413 and "POLAR_MAX_COUNT_TOKENS_BYTES" in str(refused.value)
    # A deployment cap below it is the lower bound still, and named as such.
    small = load_config({"POLAR_MAX_BODY_BYTES": str(MIB)}, cwd=tmp_path)
    assert request_cap(anthropic, "count_tokens", small) == (MIB, "for this API")
