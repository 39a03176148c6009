"""The reference engine's JSON: orjson's speed, the standard library's acceptance."""

from __future__ import annotations

import json
import math

import pytest

from polar.chat.json_codec import dumps, encode, loads


def test_what_the_standard_library_reads_is_still_read() -> None:
    assert loads(b'{"prompt": [1, 2, 3]}') == {"prompt": [1, 2, 3]}
    assert math.isnan(loads(b'{"temperature": NaN}')["temperature"])  # orjson refuses the literal
    assert loads(b'{"s": "\\ud800"}') == {"s": "\ud800"}  # a lone surrogate escape
    assert loads(b'{"seed": 18446744073709551616}') == {"seed": 2**64}  # past 64 bits
    assert loads('{"a": 1}'.encode("utf-16")) == {"a": 1}


def test_what_neither_reads_is_a_value_error() -> None:
    for bad in (b"{", b"", b"\xff\xfe\xfd"):
        with pytest.raises(ValueError):
            loads(bad)


def test_written_compact_and_in_utf8() -> None:
    payload = {"text": "你好 🙂", "ids": list(range(5)), "logprob": -0.25}
    assert encode(payload) == json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()
    assert dumps(payload) == encode(payload).decode()
    assert encode({"seed": 2**64}) == b'{"seed":18446744073709551616}'  # what orjson refuses, json writes
