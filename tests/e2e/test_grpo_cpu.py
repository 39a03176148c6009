"""The CPU GRPO loop (examples/grpo_cpu) shortened to two steps on embedded defaults, on the torch engine backend
and on real vLLM (its own server, serving the warm-started weights; new weights loaded between steps with
``reload_weights``): the mechanics, not the learning speed. Versions advance, every group arrives, captured
logprobs equal the sampling weights' own, ratios are 1 on fresh data before the update, and loss masks cover
exactly the sampled tokens. The two runs share one warm start through ``--warm-start-cache``: the first computes
and keeps it, the second loads it. Two warm-start steps are enough for that: they move the weights the engine serves
off a fresh model's by about 1 in logprob (measured), so the fidelity check fails if the engine serves anything but
the weights it was given; samples are at most 12 tokens whatever the model (the task's ``MAX_TOKENS``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.processes import run_to_end

pytestmark = [pytest.mark.long(seconds=130), pytest.mark.timeout(1800)]

REPO = Path(__file__).resolve().parents[2]
# The trainer recomputes each sampled token's logprob under the weights that sampled it. Same code on the torch
# backend; vLLM's CPU kernels against transformers' eager Qwen2, both float32, differed by at most a few 1e-6 here.
TOLERANCE = {"torch": 1e-4, "vllm": 1e-4}


@pytest.fixture(scope="module")
def warm_starts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("warm-starts")


@pytest.mark.parametrize("engine", ["torch", "vllm"])
def test_a_shortened_loop(engine: str, tmp_path: Path, warm_starts: Path) -> None:
    out = tmp_path / "rl"
    kept = any(warm_starts.iterdir())
    command = [sys.executable, "-m", "examples.grpo_cpu.train", "--out", str(out), "--steps", "2", "--tasks", "2",
               "--samples", "2", "--ahead", "0", "--warm-start-steps", "2", "--run-concurrency", "2",
               "--engine", engine, "--warm-start-cache", str(warm_starts)]  # fmt: skip
    if engine == "vllm":  # a few calls: compiling the model at start (~20 CPU-seconds here) would not pay back
        command.append("--vllm-args=--enforce-eager")
    code, output = run_to_end(command, 1500, REPO)
    assert code == 0, output[-6000:]
    assert ("supervised steps, loaded from" in output) == kept, output[-6000:]
    assert len(list(warm_starts.iterdir())) == 1
    rows = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    assert [(r["step"], r["policy_version"], r["next_policy_version"]) for r in rows] == [(0, 0, 1), (1, 1, 2)]
    for row in rows:
        assert row["groups"] == 2 and row["dropped_stale"] == 0 and row["trajectories"] == 4, row
        assert row["mask_errors"] == 0 and row["spanning_update"] == 0, row
        assert row["checked_tokens"] > 0 and row["max_abs_logprob_diff"] < TOLERANCE[engine], row
        assert row["fresh_trajectories"] == 4 and row["max_abs_ratio_minus_1_fresh"] < 1e-3, row
        assert 0.0 <= row["mean_reward"] <= 1.0
    assert (out / "reward.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if engine == "vllm":
        assert (out / "weights" / "step-2" / "model.safetensors").is_file()
        # vLLM itself ran every trajectory's sequence (its own log: a freely sampled sequence's end is written at
        # vLLM's next step, which an idle engine may never take, so the starts are what is counted).
        started = [json.loads(line) for line in (out / "vllm-samples.jsonl").read_text().splitlines()]
        assert sum(r.get("event") == "start" for r in started) >= 8
    else:
        assert (out / "weights" / "step-2.safetensors").is_file()
