"""TRL's own GRPOTrainer (trl 1.16.0) learning through Polar (examples/trl_cpu, polar.integrations.trl): a shortened
run of the demo end to end, and a run whose run worker is SIGKILLed mid-round: the lost sample is retried by Polar
and TRL is handed the retry's real sample, never a zero for the lost one. The two share one warm start through
``--warm-start-cache``: the first computes and keeps it, the second loads it."""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support import run_to_end

pytestmark = [pytest.mark.long(seconds=143), pytest.mark.timeout(1800)]

REPO = Path(__file__).resolve().parents[2]
# Polar captures the torch engine's float32 logprobs (KV-cached decoding); TRL recomputes them with the same weights
# in float32, whole sequences in a left-padded batch. Measured: 1.3e-5 at the start of a run, growing with the
# weights to 1.5e-4 by its eighth round (docs/training-data.md); bf16 autocast would be 1e-2.
TOLERANCE = 1e-3


@pytest.fixture(scope="module")
def warm_starts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("warm-starts")


def test_a_shortened_demo(tmp_path: Path, warm_starts: Path) -> None:
    out = tmp_path / "trl"
    command = [sys.executable, "-m", "examples.trl_cpu.train", "--out", str(out), "--rounds", "2", "--prompts", "2",
               "--generations", "3", "--warm-start-steps", "40", "--run-concurrency", "2",
               "--warm-start-cache", str(warm_starts)]  # fmt: skip
    code, output = run_to_end(command, 1500, REPO)
    assert code == 0, output[-6000:]
    assert "supervised steps, loss" in output and len(list(warm_starts.iterdir())) == 1, output[-6000:]
    rows = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    assert [(r["step"], r["policy_version"]) for r in rows] == [(0, 0), (1, 1)], rows
    assert [r["captured_policy_versions"] for r in rows] == [["0"], ["1"]]
    for row in rows:
        assert row["samples"] == 6 and row["unscored"] == 0 and row["split_sessions"] == 0, row
        assert row["sampled_tokens"] > 0, row  # (40 warm-start steps seldom make a tool call: no env tokens yet)
        assert row["checked_tokens"] == row["sampled_tokens"], row
        assert row["max_abs_logprob_diff"] < TOLERANCE, row
        assert 0.0 <= row["mean_reward"] <= 1.0
    assert (out / "reward.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "weights" / "step-1.safetensors").is_file()


def _kill_when_running(client: Any, rollouts: Any, stack: Any, seen: dict[str, Any], done: threading.Event) -> None:
    """SIGKILL the run worker once a session of the first rollout is running and has made its first call, then
    start a new one (as a service manager would)."""
    while not done.is_set():
        for batch_id in list(rollouts.batch_ids[:1]):
            running = [s for s in client.sessions(batch_id) if s["state"] == "running" and s["num_calls"] >= 1]
            if running:
                seen["victims"] = {s["session_id"] for s in running}
                stack.signal("worker-run", signal.SIGKILL)
                stack.processes["worker-run"].wait()
                stack.start_one("worker-run")
                return
        time.sleep(0.1)


def test_a_killed_run_worker_hands_trl_no_zero(tmp_path: Path, warm_starts: Path) -> None:
    from examples.trl_cpu import train
    from polar.integrations.adapter import PolarRollouts
    from polar.integrations.trl import PolarRolloutFunc

    options = train.Options(out=tmp_path / "trl", rounds=1, prompts=2, generations=3, iterations=1,
                            warm_start_steps=40, run_concurrency=2, warm_start_cache=str(warm_starts))  # fmt: skip
    options.out.mkdir(parents=True)
    said: list[str] = []
    kept = any(warm_starts.iterdir())  # the first test's warm start (when this one runs alone, it trains its own)
    model, weights = train.prepare(options, said.append)
    assert any("supervised steps, loaded from" in line for line in said) == kept, said
    handed: list[dict[str, Any]] = []
    original = PolarRolloutFunc.__call__

    def recording(self: PolarRolloutFunc, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        output = original(self, prompts, trainer)
        handed.append(output)
        return output

    env = {"POLAR_HEARTBEAT_INTERVAL": "0.5", "POLAR_STALE_AFTER": "4"}  # a lost run worker is noticed in seconds
    seen: dict[str, Any] = {}
    done = threading.Event()
    with train.embedded(options, weights, env) as (client, engine_url, stack):
        rollouts = PolarRollouts(client, engine_url)
        killer = threading.Thread(target=_kill_when_running, args=(client, rollouts, stack, seen, done), daemon=True)
        killer.start()
        PolarRolloutFunc.__call__ = recording  # type: ignore[method-assign]
        try:
            rows = train.train(options, client, engine_url, model, print, rollouts=rollouts)
        finally:
            PolarRolloutFunc.__call__ = original  # type: ignore[method-assign]
            done.set()
        killer.join(timeout=60)
        assert seen.get("victims"), "the run worker was never killed mid-round"
        lost = {v: client.session(v) for v in seen["victims"]}
        statuses = [client.batch(b) for b in rollouts.batch_ids]
    assert {s["outcome"] for s in lost.values()} == {"worker_lost"}, lost
    assert all(s["reward"] is None for s in lost.values())
    assert sum(b["attempts"]["retried"] for b in statuses) >= 1, statuses
    (output,) = handed
    # TRL got every sample it asked for, none of them the lost attempt, each the model's real tokens and reward.
    assert len(output["completion_ids"]) == len(output["polar_reward"]) == 6
    assert not set(output["polar_session_id"]) & seen["victims"]
    assert max(output["polar_attempt"]) >= 2, output["polar_attempt"]
    assert all(sum(mask) > 0 for mask in output["env_mask"])
    assert all(reward is not None for reward in output["polar_reward"])
    assert rows[0]["samples"] == 6 and rows[0]["retried_samples"] >= 1, rows
