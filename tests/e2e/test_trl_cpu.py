"""TRL's own GRPOTrainer (trl 1.16.0) learning through Polar (examples/trl_cpu, polar.integrations.trl): a shortened
run of the demo end to end (``examples.trl_cpu.train.main`` on a command line, in this process), whose run worker
is SIGKILLed mid-way through its first round: the lost sample is retried by Polar and TRL is handed the retry's
real sample, never a zero for the lost one; the second round, on the next policy version, runs on the restarted
worker. One stack and one warm start serve both properties."""

from __future__ import annotations

import contextlib
import json
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.long(seconds=80), pytest.mark.timeout(1800)]

# Polar captures the torch engine's float32 logprobs (KV-cached decoding); TRL recomputes them with the same weights
# in float32, whole sequences in a left-padded batch. Measured: 1.3e-5 at the start of a run, growing with the
# weights to 1.5e-4 by its eighth round (docs/training-data.md); bf16 autocast would be 1e-2.
TOLERANCE = 1e-3


def _kill_when_running(client: Any, rollouts: list[Any], stack: Any, seen: dict[str, Any],
                       done: threading.Event) -> None:  # fmt: skip
    """SIGKILL the run worker once a session of the first rollout is running and has made its first call, then
    start a new one (as a service manager would)."""
    while not done.is_set():
        for batch_id in [b for r in rollouts for b in r.batch_ids][:1]:
            running = [s for s in client.sessions(batch_id) if s["state"] == "running" and s["num_calls"] >= 1]
            if running:
                seen["victims"] = {s["session_id"] for s in running}
                stack.signal("worker-run", signal.SIGKILL)
                stack.processes["worker-run"].wait()
                stack.start_one("worker-run")
                return
        time.sleep(0.1)


def test_a_shortened_demo_whose_run_worker_is_killed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    from examples.trl_cpu import train
    from polar.integrations.trl import PolarRolloutFunc

    out, warm_starts = tmp_path / "trl", tmp_path / "warm-starts"
    handed: list[dict[str, Any]] = []
    original_call = PolarRolloutFunc.__call__

    def recording(self: PolarRolloutFunc, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        output = original_call(self, prompts, trainer)
        handed.append(output)
        return output

    rollouts: list[Any] = []
    original_rollouts = train.PolarRollouts

    def kept_rollouts(*args: Any, **kwargs: Any) -> Any:
        rollouts.append(original_rollouts(*args, **kwargs))
        return rollouts[-1]

    seen: dict[str, Any] = {}
    done = threading.Event()
    lost: dict[str, Any] = {}
    statuses: list[dict[str, Any]] = []
    original_embedded = train.embedded

    @contextlib.contextmanager
    def watched(options: Any, weights: Path, env: dict[str, str] | None = None) -> Iterator[Any]:
        env = {"POLAR_HEARTBEAT_INTERVAL": "0.5", "POLAR_STALE_AFTER": "4"}  # a lost run worker is noticed in seconds
        with original_embedded(options, weights, env) as (client, engine_url, stack):
            killer = threading.Thread(target=_kill_when_running, args=(client, rollouts, stack, seen, done),
                                      daemon=True)  # fmt: skip
            killer.start()
            try:
                yield client, engine_url, stack
            finally:
                done.set()
                killer.join(timeout=60)
            lost.update({v: client.session(v) for v in seen.get("victims", ())})
            statuses.extend(client.batch(b) for r in rollouts for b in r.batch_ids)

    monkeypatch.setattr(PolarRolloutFunc, "__call__", recording)
    monkeypatch.setattr(train, "PolarRollouts", kept_rollouts)
    monkeypatch.setattr(train, "embedded", watched)
    sigterm = signal.getsignal(signal.SIGTERM)  # main() unwinds its stack on a SIGTERM; this process's own after
    try:
        code = train.main(["--out", str(out), "--rounds", "2", "--prompts", "2", "--generations", "3",
                           "--warm-start-steps", "40", "--run-concurrency", "2",
                           "--warm-start-cache", str(warm_starts)])  # fmt: skip
    finally:
        signal.signal(signal.SIGTERM, sigterm)
    output = capsys.readouterr().out
    assert code == 0, output[-6000:]
    assert "supervised steps, loss" in output and len(list(warm_starts.iterdir())) == 1, output[-6000:]

    # The demo's rounds: versions advance, every sample arrives scored, Polar's logprobs are TRL's own.
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

    # The killed run worker's session: lost, retried, and TRL handed the retry's real sample in its place.
    assert seen.get("victims"), "the run worker was never killed mid-round"
    assert {s["outcome"] for s in lost.values()} == {"worker_lost"}, lost
    assert all(s["reward"] is None for s in lost.values())
    assert sum(b["attempts"]["retried"] for b in statuses) >= 1, statuses
    first = handed[0]
    assert len(handed) == 2
    # TRL got every sample it asked for, none of them the lost attempt, each the model's real tokens and reward.
    assert len(first["completion_ids"]) == len(first["polar_reward"]) == 6
    assert not set(first["polar_session_id"]) & seen["victims"]
    assert max(first["polar_attempt"]) >= 2, first["polar_attempt"]
    assert all(sum(mask) > 0 for mask in first["env_mask"])
    assert all(reward is not None for reward in first["polar_reward"])
    assert rows[0]["retried_samples"] >= 1, rows
