"""The CPU GRPO loop (examples/grpo_cpu) shortened to two steps on embedded defaults: the mechanics, not the
learning speed. Versions advance, every group arrives, captured logprobs equal the sampling weights' own, ratios
are 1 on fresh data before the update, and loss masks cover exactly the sampled tokens."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.long(seconds=108), pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]


def test_a_shortened_loop(tmp_path: Path) -> None:
    out = tmp_path / "rl"
    command = [sys.executable, "-m", "examples.grpo_cpu.train", "--out", str(out), "--steps", "2", "--tasks", "2",
               "--samples", "3", "--ahead", "0", "--warm-start-steps", "40", "--run-concurrency", "2"]  # fmt: skip
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    assert [(r["step"], r["policy_version"], r["next_policy_version"]) for r in rows] == [(0, 0, 1), (1, 1, 2)]
    for row in rows:
        assert row["groups"] == 2 and row["dropped_stale"] == 0 and row["trajectories"] == 6, row
        assert row["mask_errors"] == 0 and row["spanning_update"] == 0, row
        assert row["checked_tokens"] > 0 and row["max_abs_logprob_diff"] < 1e-4, row
        assert row["fresh_trajectories"] == 6 and row["max_abs_ratio_minus_1_fresh"] < 1e-3, row
        assert 0.0 <= row["mean_reward"] <= 1.0
    assert (out / "reward.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "weights" / "step-2.safetensors").is_file()
