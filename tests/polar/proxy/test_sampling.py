"""The sampling record and ``sampling: neutralize`` (polar.proxy.sampling), pure."""

from __future__ import annotations

from polar.proxy.sampling import engine_sampling

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
