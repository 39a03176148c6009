"""Engine utilisation through the pipeline: does the engine ever wait for Polar?

The reference engine's capacity model stands in for a GPU (``--slots`` sequences at once; an answer of
``--answer-tokens`` at ``--decode-rate`` tokens/s holds a slot). Sessions are agent-shaped (``bench/agents/paced``):
``--calls`` chained calls with ``--tool-s`` of tool time between them (every ``--slow-every``-th task ``--slow-tool-s``:
a long tail), a prepare step of ``--init-s`` and an evaluator command of ``--eval-s``.

Two configurations of the same work, each on a fresh stack (engine, API, proxy, four stage pools) and database:

- **polar**: as configured: prepare in init (ahead of run, within the READY bound), scoring in postrun, four pools.
- **baseline**: each run slot does a session's set-up, run and scoring back to back (the harness sleeps
  ``--init-s`` before and ``--eval-s`` after its calls; no prepare step, no evaluator command).

Figures, per configuration:
- occupancy: busy slot-seconds / (slots x makespan), exact (the engine integrates its running sequences:
  ``polar_engine_busy_slot_seconds_total``); steady state: the same between the first moment every slot was busy
  and the moment the last session started running (the gauge ``vllm:num_requests_running`` sampled every
  ``--sample-ms``);
- idle while sessions wait: the fraction of time, while some session has not yet started running, that the
  engine runs nothing (and, "underfed", fewer than all its slots);
- the same occupancy as the proxy's ``/metrics`` observe it (``polar_engine_call_seconds_total``, the seconds of
  requests it had in flight, over slots x makespan): what an operator sees of a real engine;
- makespan against the ideal: max(total engine slot-seconds / slots, the longest session on its own);
- groups: when each task's group (all its samples) was finished, from submission (p50 / max).

Needs PostgreSQL (``POLAR_BENCH_ADMIN_DSN``) and Redis (``POLAR_BENCH_REDIS``), as ``bench/prewarm.py``.

    python bench/pipeline.py [--tasks 12 --samples 4 --slots 4 --run-concurrency 8]
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout, for bench.*

from bench.deployment import scratch_deployment
from polar.client import PolarClient
from polar.local.launcher import Stack, pipeline_specs

REPO = Path(__file__).resolve().parents[1]
REDIS_DB = 13
GOALS = {"makespan / ideal": "<= 1.10", "steady-state occupancy": ">= 95 %"}


@dataclass
class Samples:
    """The engine's running-sequence gauge over time, sampled from its /metrics."""

    times: list[float] = field(default_factory=list)  # wall clock, seconds
    running: list[int] = field(default_factory=list)

    def window(self, start: float, end: float) -> list[int]:
        lo, hi = bisect.bisect_left(self.times, start), bisect.bisect_right(self.times, end)
        return self.running[lo:hi]


def _scrape(url: str) -> dict[str, float]:
    """A /metrics page, each series summed over its labels."""
    values: dict[str, float] = {}
    for line in httpx.get(f"{url}/metrics", timeout=5).text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name.split("{")[0]] = values.get(name.split("{")[0], 0.0) + float(value)
    return values


def _sample(engine_url: str, every_s: float, samples: Samples, stop: threading.Event) -> None:
    with httpx.Client(timeout=5) as client:
        while not stop.is_set():
            text = client.get(f"{engine_url}/metrics").text
            running = next(line for line in text.splitlines() if line.startswith("vllm:num_requests_running"))
            samples.times.append(time.time())
            samples.running.append(int(float(running.rpartition(" ")[2])))
            stop.wait(every_s)


def _task(index: int, args: argparse.Namespace, baseline: bool) -> dict[str, Any]:
    slow = args.slow_every > 0 and index % args.slow_every == args.slow_every - 1
    env = {
        "PYTHONPATH": str(REPO),
        "PACED_CALLS": str(args.calls),
        "PACED_TOOL_S": str(args.slow_tool_s if slow else args.tool_s),
    }
    task: dict[str, Any] = {
        "task_id": f"t{index:03d}",
        "instruction": f"Task {index}.",
        "num_samples": args.samples,
        "timeout_seconds": 600,
        "harness": {"name": "python", "command": "bench.agents.paced:run", "env": env},
    }
    if baseline:
        env |= {"PACED_SETUP_S": str(args.init_s), "PACED_SCORE_S": str(args.eval_s)}
    else:
        task["runtime"] = {"prepare": [{"run": f"sleep {args.init_s}"}]}
        task["evaluator"] = {"name": "test_on_output",
                             "config": {"command": f"sleep {args.eval_s}", "reward_from": "exit_code"}}  # fmt: skip
    return task


def _session_times(database_url: str) -> dict[str, Any]:
    """When each session started running, in order, and when each task's group (all its samples) ended."""
    query = """
        SELECT s.id, s.task_id, e.to_state, extract(epoch FROM e.at)
        FROM session_events e JOIN sessions s ON s.id = e.session_id ORDER BY e.at, e.id"""
    with psycopg.connect(database_url.replace("+psycopg", "")) as connection:
        rows = connection.execute(query).fetchall()
        calls = connection.execute(
            "SELECT session_id, min(extract(epoch FROM created_at) - latency_ms / 1000),"
            " max(extract(epoch FROM created_at)) FROM model_calls GROUP BY session_id"
        ).fetchall()
    started: dict[Any, float] = {}
    ended: dict[Any, float] = {}
    admitted: dict[Any, float] = {}
    ready: dict[Any, float] = {}
    left: dict[Any, float] = {}  # left the run slot: entered postrun
    tasks: dict[Any, str] = {}
    for session_id, task_id, to_state, at in rows:
        tasks[session_id] = task_id
        if to_state == "running":
            started.setdefault(session_id, float(at))
        if to_state in ("completed", "failed", "timed_out", "cancelled"):
            ended[session_id] = float(at)
        if to_state == "init":
            admitted.setdefault(session_id, float(at))
        if to_state == "ready":
            ready.setdefault(session_id, float(at))
        if to_state == "postrun":
            left.setdefault(session_id, float(at))
    groups: dict[str, float] = {}
    for session_id, at in ended.items():
        groups[tasks[session_id]] = max(groups.get(tasks[session_id], 0.0), at)
    first_call = {row[0]: (float(row[1]), float(row[2])) for row in calls}
    slot = _slot_time(started, left, ready, first_call)
    running = [(started[s], left[s]) for s in started if s in left]
    # The ramp: the sessions that started first, each as (admitted, ready, running, its first call).
    ramp = [(admitted.get(s, t), ready.get(s, t), t, first_call[s][0] if s in first_call else t)
            for s, t in sorted(started.items(), key=lambda item: item[1])]  # fmt: skip
    return {"started": sorted(started.values()), "groups": sorted(groups.values()), "slot": slot, "running": running,
            "ramp": ramp}  # fmt: skip


def _slot_time(started: dict[Any, float], left: dict[Any, float], ready: dict[Any, float],
               calls: dict[Any, tuple[float, float]]) -> dict[str, float]:  # fmt: skip
    """Where a run slot's time went, per session (means, seconds): waiting in ``ready`` for a slot, from
    ``running`` to the first call's start (the harness starting), and from the last call's end to ``postrun``."""
    sessions = [s for s in started if s in left and s in calls]
    return {
        "ready_wait_s": statistics.fmean(started[s] - ready[s] for s in sessions if s in ready),
        "to_first_call_s": statistics.fmean(calls[s][0] - started[s] for s in sessions),
        "after_last_call_s": statistics.fmean(left[s] - calls[s][1] for s in sessions),
        "in_run_slot_s": statistics.fmean(left[s] - started[s] for s in sessions),
    }


def run_configuration(args: argparse.Namespace, baseline: bool) -> dict[str, Any]:
    engine_args = ["--policy-config", json.dumps({"tokens": args.answer_tokens}), "--max-num-seqs", str(args.slots),
                   "--decode-rate", str(args.decode_rate), "--prefill-rate", str(args.prefill_rate)]  # fmt: skip
    samples, stop = Samples(), threading.Event()
    plugins = {"POLAR_PLUGIN_MODULES": "bench.agents"}
    with scratch_deployment("pipeline", REDIS_DB, args.run_concurrency, plugins) as deployment:
        env = deployment.env
        specs = pipeline_specs(deployment.ports, "echo", engine_args, args.run_concurrency)
        engine_url = env["POLAR_ENGINE_URLS"]
        with Stack(specs, env, deployment.tmp / "logs"):
            client = PolarClient(env["POLAR_API_URL"], env["POLAR_API_TOKEN"])
            sampler = threading.Thread(target=_sample, args=(engine_url, args.sample_ms / 1000, samples, stop))
            try:
                proxy_url = env["POLAR_PROXY_URL"]
                before = _scrape(engine_url)["polar_engine_busy_slot_seconds_total"]
                proxy_before = _scrape(proxy_url)["polar_engine_call_seconds_total"]
                sampler.start()
                submitted_at = time.time()
                batch = client.submit({"tasks": [_task(i, args, baseline) for i in range(args.tasks)]})
                final = client.wait(batch["batch_id"], timeout_s=3600, poll_s=0.2)
                finished_at = time.time()
                busy = _scrape(engine_url)["polar_engine_busy_slot_seconds_total"] - before
                proxy_busy = _scrape(proxy_url)["polar_engine_call_seconds_total"] - proxy_before
            finally:
                stop.set()
                if sampler.is_alive():
                    sampler.join()
                client.close()
        sessions = _session_times(deployment.database_url)
    figures = _figures(args, final, submitted_at, finished_at, busy, samples, sessions)
    figures["proxy_occupancy"] = proxy_busy / (args.slots * figures["makespan_s"])
    return figures


def _figures(args: argparse.Namespace, final: dict[str, Any], submitted_at: float, finished_at: float, busy: float,
             samples: Samples, sessions: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    makespan = finished_at - submitted_at
    # The longest session on its own: its prepare, calls, slowest tool time and scoring with nothing to wait for.
    decode = args.answer_tokens / args.decode_rate if args.decode_rate > 0 else 0.0
    has_slow = 0 < args.slow_every <= args.tasks  # a task with the slow tool time exists
    tool = max(args.tool_s, args.slow_tool_s) if has_slow else args.tool_s
    longest = args.init_s + args.calls * decode + (args.calls - 1) * tool + args.eval_s
    ideal = max(busy / args.slots, longest)
    last_start = sessions["started"][-1]
    waiting = samples.window(submitted_at, last_start)  # some session has not started running yet
    full = next((t for t, r in zip(samples.times, samples.running, strict=True) if r >= args.slots), None)
    if full is not None and full >= last_start:
        full = None  # every session started before the engine was ever full: no steady state to speak of
    steady = samples.window(full, last_start) if full is not None else []
    groups = [at - submitted_at for at in sessions["groups"]]
    return {
        "counts": " ".join(f"{state} {n}" for state, n in sorted(final["counts"].items())),
        "makespan_s": makespan,
        "ideal_s": ideal,
        "ratio": makespan / ideal,
        "occupancy": busy / (args.slots * makespan),
        "steady": statistics.fmean(steady) / args.slots if steady else float("nan"),
        "steady_s": (last_start - full) if full is not None else 0.0,
        "idle_waiting": sum(r == 0 for r in waiting) / len(waiting) if waiting else float("nan"),
        "underfed_waiting": sum(r < args.slots for r in waiting) / len(waiting) if waiting else float("nan"),
        "first_full_s": (full - submitted_at) if full is not None else float("nan"),  # nan: none (see above)
        "groups_p50_s": statistics.median(groups),
        "groups_max_s": max(groups),
        "busy_slot_s": busy,
        **sessions["slot"],
        **_ramp(sessions["ramp"][: args.run_concurrency], submitted_at),
        "run_slots_filled": _filled(sessions["running"], full, last_start, args.run_concurrency)
        if full
        else float("nan"),
    }


def _ramp(first: list[tuple[float, float, float, float]], submitted_at: float) -> dict[str, float]:
    """When the first sessions to run (as many as run slots) reached each step, from submission (medians, s)."""
    steps = ("ramp_admitted_s", "ramp_ready_s", "ramp_running_s", "ramp_first_call_s")
    return {name: statistics.median(times[i] - submitted_at for times in first) for i, name in enumerate(steps)}


def _filled(running: list[tuple[float, float]], start: float, end: float, slots: int) -> float:
    """The share of ``slots`` run slots holding a running session between ``start`` and ``end``."""
    held = sum(max(0.0, min(b, end) - max(a, start)) for a, b in running)
    return held / (slots * (end - start))


ROWS = [
    ("sessions", "counts", "{}"),
    ("makespan, s", "makespan_s", "{:.1f}"),
    ("ideal, s", "ideal_s", "{:.1f}"),
    ("makespan / ideal", "ratio", "{:.2f}"),
    ("occupancy over the batch", "occupancy", "{:.1%}"),
    ("  as the proxy's /metrics see it", "proxy_occupancy", "{:.1%}"),
    ("steady-state occupancy", "steady", "{:.1%}"),
    ("steady state lasted, s", "steady_s", "{:.1f}"),
    ("engine idle while sessions wait", "idle_waiting", "{:.1%}"),
    ("engine underfed while sessions wait", "underfed_waiting", "{:.1%}"),
    ("first moment all slots busy, s", "first_full_s", "{:.1f}"),
    ("groups finished, p50, s", "groups_p50_s", "{:.1f}"),
    ("groups finished, max, s", "groups_max_s", "{:.1f}"),
    ("engine busy slot-seconds", "busy_slot_s", "{:.1f}"),
    ("ramp, the first sessions to run: admitted, s", "ramp_admitted_s", "{:.2f}"),
    ("  ready, s", "ramp_ready_s", "{:.2f}"),
    ("  running, s", "ramp_running_s", "{:.2f}"),
    ("  first call, s", "ramp_first_call_s", "{:.2f}"),
    ("run slots filled in the steady state", "run_slots_filled", "{:.1%}"),
    ("per session: in a run slot, s", "in_run_slot_s", "{:.2f}"),
    ("  running to its first call, s", "to_first_call_s", "{:.2f}"),
    ("  its last call to postrun, s", "after_last_call_s", "{:.2f}"),
    ("  waited in ready for a slot, s", "ready_wait_s", "{:.2f}"),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=12)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--calls", type=int, default=4)
    parser.add_argument("--answer-tokens", type=int, default=200)
    parser.add_argument("--decode-rate", type=float, default=100.0, help="tokens/s of one sequence")
    parser.add_argument("--prefill-rate", type=float, default=20000.0, help="prompt tokens/s")
    parser.add_argument("--slots", type=int, default=4, help="the engine's max_num_seqs")
    parser.add_argument("--tool-s", type=float, default=1.0)
    parser.add_argument("--slow-every", type=int, default=5)
    parser.add_argument("--slow-tool-s", type=float, default=4.0)
    parser.add_argument("--init-s", type=float, default=3.5, help="prepare step (about a third of a session's run)")
    parser.add_argument("--eval-s", type=float, default=1.5, help="evaluator command")
    parser.add_argument("--run-concurrency", type=int, default=8)
    parser.add_argument("--sample-ms", type=float, default=50.0)
    parser.add_argument("--only", choices=["polar", "baseline"], default=None)
    args = parser.parse_args()
    shape = (f"{args.tasks} tasks x {args.samples} samples, {args.calls} calls of {args.answer_tokens} tokens at "
             f"{args.decode_rate:g} tok/s, tool {args.tool_s:g} s (every {args.slow_every}th task "
             f"{args.slow_tool_s:g} s), init {args.init_s:g} s, eval {args.eval_s:g} s")  # fmt: skip
    print(f"pipeline: {shape}; engine {args.slots} slots, run concurrency {args.run_concurrency}; "
          f"{os.cpu_count()} cores")  # fmt: skip
    names = [args.only] if args.only else ["polar", "baseline"]
    results = {name: run_configuration(args, baseline=name == "baseline") for name in names}
    width = max(len(label) for label, _, _ in ROWS)
    print(f"{'':<{width}}  " + "  ".join(f"{name:>14}" for name in names) + "  goal")
    for label, key, fmt in ROWS:
        cells = "  ".join(f"{fmt.format(results[name][key]):>14}" for name in names)
        print(f"{label:<{width}}  {cells}  {GOALS.get(label, '')}")
    if len(names) == 2:
        polar, baseline = results["polar"], results["baseline"]
        print(f"polar vs baseline: makespan x{polar['makespan_s'] / baseline['makespan_s']:.2f}, "
              f"occupancy {polar['occupancy']:.1%} vs {baseline['occupancy']:.1%}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
