"""What real vLLM (the run's shared CPU server, started with its default ``--logprobs-mode``) reports to the
logprob-mode probe: raw logprobs, the model's distribution before temperature and top-p."""

from __future__ import annotations

import httpx

from polar.records.logprob_mode import probe
from tests.real_vllm import SharedVllm

GUARD_S = 120  # a hang guard for a CPU vLLM beside the suite, not a speed claim


def test_real_vllm_reports_raw_logprobs_by_default(real_vllm: SharedVllm) -> None:
    with httpx.Client(timeout=GUARD_S) as client:
        assert probe(client, real_vllm.url) == {"logprob_mode": "raw", "logprob_mode_error": None}
