"""The sampling record and ``sampling: neutralize`` (polar.proxy.sampling), pure."""

from __future__ import annotations

from pathlib import Path

import pytest

from polar.config import load_config
from polar.errors import ValidationError
from polar.proxy.sampling import capped, engine_sampling

ASKED = {"messages": [], "temperature": 0.2, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "repetition_penalty": 1.2,
         "presence_penalty": 0.1, "frequency_penalty": 0.3, "seed": 3, "max_tokens": 64, "tools": []}  # fmt: skip


def test_record_sends_what_was_asked_after_the_deployment_overrides() -> None:
    sent, record = engine_sampling(ASKED, {"temperature": 0.7}, "record")
    assert sent == {**ASKED, "temperature": 0.7}
    asked = {k: v for k, v in ASKED.items() if k not in ("messages", "tools")}
    assert record == {"requested": asked, "used": {**asked, "temperature": 0.7}, "mode": "record"}


def test_neutralize_samples_from_the_policy_itself_and_keeps_seed_and_length() -> None:
    sent, record = engine_sampling(ASKED, {"temperature": 0.7}, "neutralize")
    assert sent == {"messages": [], "tools": [], "temperature": 1.0, "top_p": 1.0, "seed": 3, "max_tokens": 64}
    assert record["used"] == {"temperature": 1.0, "top_p": 1.0, "seed": 3, "max_tokens": 64}
    assert record["requested"]["top_k"] == 40 and record["mode"] == "neutralize"


def test_the_new_tokens_asked_are_capped_and_a_call_asking_none_is_sent_the_cap() -> None:
    sent, record = engine_sampling({"messages": [], "max_tokens": 50_000}, {}, "record", max_tokens=12_000)
    assert sent["max_tokens"] == 12_000 and record["used"]["max_tokens"] == 12_000
    assert record["requested"]["max_tokens"] == 50_000  # what the harness asked stays on record
    sent, record = engine_sampling({"messages": []}, {}, "neutralize", max_tokens=12_000)
    assert sent["max_tokens"] == 12_000 and record["used"] == {"temperature": 1.0, "top_p": 1.0, "max_tokens": 12_000}
    assert record["requested"] == {}
    sent, _ = engine_sampling({"messages": [], "max_tokens": 64}, {}, "record", max_tokens=12_000)
    assert sent["max_tokens"] == 64  # under the cap: what was asked
    sent, _ = engine_sampling({"messages": []}, {"max_tokens": 90_000}, "record", max_tokens=12_000)
    assert sent["max_tokens"] == 12_000  # the deployment's overrides are capped too


def test_the_cap_covers_every_length_field_and_every_spelling_of_a_number() -> None:
    assert capped({"max_completion_tokens": 40_000}, 100) == {"max_completion_tokens": 100}
    assert capped({"max_tokens": 40_000, "max_completion_tokens": 50}, 100) == {
        "max_tokens": 100,
        "max_completion_tokens": 50,
    }
    assert capped({"max_tokens": None}, 100) == {"max_tokens": 100}
    assert capped({"max_tokens": 1e9}, 100) == {"max_tokens": 100}
    assert capped({"max_tokens": "40000"}, 100) == {"max_tokens": 100}  # vLLM reads "40000" as 40000
    for bad in ("many", [1], {"n": 1}, -5, 0, True):  # no number above the cap: left for the engine to refuse
        assert capped({"max_tokens": bad}, 100) == {"max_tokens": bad}


def test_the_cap_is_what_the_engine_decodes_within_its_timeout_at_the_guaranteed_rate(tmp_path: Path) -> None:
    def cap(**env: str) -> int:
        return load_config({"POLAR_DATABASE_URL": "sqlite://", **env}, cwd=tmp_path).max_tokens_cap

    assert cap() == 12_000  # 600 s at 20 tokens/s
    assert cap(POLAR_ENGINE_TIMEOUT="900", POLAR_MIN_DECODE_RATE="50") == 45_000
    assert cap(POLAR_ENGINE_TIMEOUT="900", POLAR_MAX_NEW_TOKENS="32768") == 32_768  # set: taken as it is
    for name, value in (("POLAR_MAX_NEW_TOKENS", "0"), ("POLAR_MAX_NEW_TOKENS", "lots"), ("POLAR_MIN_DECODE_RATE", "0"),
                        ("POLAR_MIN_DECODE_RATE", "-3"), ("POLAR_MIN_DECODE_RATE", "inf")):  # fmt: skip
        with pytest.raises(ValidationError) as bad:
            cap(**{name: value})
        assert bad.value.field == name
