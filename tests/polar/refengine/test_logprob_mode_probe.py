"""The logprob-mode probe (polar.records.logprob_mode) against real engines: the torch backend's real model with
raw logprobs (vLLM's default) and with processed ones (vLLM's ``--logprobs-mode processed_logprobs``), the scripted
backend, and an engine that sends no logprobs; and the mode kept in a batch's engine provenance."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from polar.records.logprob_mode import compare, probe
from polar.records.provenance import EngineProbe
from tests.polar.conftest import RunningEngine

StartEngine = Callable[..., RunningEngine]
GUARD_S = 120  # a hang guard (a loaded machine's torch engine may take seconds), not a speed claim


@pytest.mark.parametrize(("mode", "expected"), [("raw_logprobs", "raw"), ("processed_logprobs", "processed")])
def test_the_torch_backend_is_told_apart(start_engine: StartEngine, mode: str, expected: str) -> None:
    engine = start_engine(backend="torch", seed=3, logprobs_mode=mode)
    with httpx.Client(timeout=GUARD_S) as client:
        assert probe(client, engine.url) == {"logprob_mode": expected, "logprob_mode_error": None}


def test_the_scripted_backend_reports_raw_and_provenance_keeps_it(start_engine: StartEngine) -> None:
    engine = start_engine()
    facts = EngineProbe(timeout_s=GUARD_S).engines([engine.url])[0]
    assert (facts["logprob_mode"], facts["logprob_mode_error"]) == ("raw", None)


def test_no_logprobs_is_no_answer() -> None:
    with pytest.raises(ValueError):
        compare({"choices": [{"logprobs": None}]}, {"choices": [{"logprobs": None}]})
    with httpx.Client(timeout=2) as client:
        found = probe(client, "http://127.0.0.1:9")  # nothing listens on the discard port
    assert found["logprob_mode"] is None and "ConnectError" in found["logprob_mode_error"]
