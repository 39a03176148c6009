"""Prewarm: how long a freed run slot waits for the next harness to start, with init running ahead of run
inside the READY bound (the default, twice the run concurrency) and without (a bound of 1: one session prepared
at a time, so a freed slot waits for its init; the bound counts init + ready, never running sessions).

Each configuration gets a fresh stack (engine, API, proxy, four stage workers) on a throwaway Postgres database
and Redis db 12, and runs one batch of ``command`` sessions (``sleep 2``) whose init is slow
(``runtime.prepare: sleep 1.5``, standing in for a container start). From ``session_events`` it pairs every
slot freed by a session leaving ``running`` with the next session entering ``running`` and reports the gaps.
Needs PostgreSQL (``POLAR_BENCH_ADMIN_DSN``, default the local ``test`` database) and Redis
(``POLAR_BENCH_REDIS``, default ``redis://127.0.0.1:6379``).

    python bench/prewarm.py [--sessions 12] [--run-concurrency 2] [--init-s 1.5] [--run-s 2] [--buffers 4,1]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import deque
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout, for bench.*

from bench.deployment import scratch_deployment
from polar.client import PolarClient
from polar.local.launcher import Stack, pipeline_specs

REDIS_DB = 12
EXPLAIN = (
    "gap = time from a session leaving `running` (its postrun event: a run slot frees) to the next session "
    "entering `running` (the next harness start); slots freed after the last session started are not counted."
)


def _events(database_url: str) -> list[tuple[Any, str, datetime, str | None]]:
    query = "SELECT session_id, to_state, at, worker FROM session_events ORDER BY at, id"
    with psycopg.connect(database_url.replace("+psycopg", "")) as connection:
        return [tuple(row) for row in connection.execute(query).fetchall()]  # type: ignore[misc]


def _gaps(events: list[tuple[Any, str, datetime, str | None]]) -> tuple[list[float], float, int, int]:
    """Slot-free to next-start gaps (ms), batch wall time (s, first to last event), peaks of init + ready and of ready.

    A slot freed by ``running -> postrun`` is queued; each later ``-> running`` takes the oldest freed slot.
    """
    state: dict[Any, str] = {}
    freed: deque[datetime] = deque()
    gaps: list[float] = []
    buffered_max = ready_max = 0
    for session_id, to_state, at, _worker in events:
        previous = state.get(session_id)
        state[session_id] = to_state
        if to_state == "postrun" and previous == "running":
            freed.append(at)
        elif to_state == "running" and freed:
            gaps.append((at - freed.popleft()).total_seconds() * 1000)
        states = list(state.values())
        buffered_max = max(buffered_max, states.count("init") + states.count("ready"))
        ready_max = max(ready_max, states.count("ready"))
    wall = (events[-1][2] - events[0][2]).total_seconds() if events else 0.0
    return gaps, wall, buffered_max, ready_max


def _run(args: argparse.Namespace, ready_buffer: int) -> dict[str, Any]:
    task = {
        "task_id": "prewarm",
        "instruction": "x",
        "num_samples": args.sessions,
        "harness": {"name": "command", "command": f"sleep {args.run_s}"},
        "runtime": {"prepare": [{"run": f"sleep {args.init_s}"}]},
    }
    buffer = {"POLAR_READY_BUFFER": str(ready_buffer)}
    with scratch_deployment("prewarm", REDIS_DB, args.run_concurrency, buffer) as deployment:
        env = deployment.env
        specs = pipeline_specs(deployment.ports, "echo", (), args.run_concurrency, proxy_workers=1, proxy_threads=8)
        with Stack(specs, env, deployment.tmp / "logs"):
            client = PolarClient(env["POLAR_API_URL"], env["POLAR_API_TOKEN"])
            try:
                started = time.monotonic()
                batch_id = client.submit({"tasks": [task]})["batch_id"]
                final = client.wait(batch_id, timeout_s=120, poll_s=0.1)
                client_wall = time.monotonic() - started
            finally:
                client.close()
        gaps, wall, buffered_max, ready_max = _gaps(_events(deployment.database_url))
    return {
        "counts": final["counts"],
        "gaps": gaps,
        "wall": wall,
        "client_wall": client_wall,
        "peak": buffered_max,
        "ready": ready_max,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=12)
    parser.add_argument("--run-concurrency", type=int, default=2)
    parser.add_argument("--init-s", type=float, default=1.5)
    parser.add_argument("--run-s", type=float, default=2.0)
    parser.add_argument("--buffers", default=None, help="READY buffers to compare (default: 2x concurrency and 1)")
    args = parser.parse_args()
    concurrency = args.run_concurrency
    buffers = [int(b) for b in args.buffers.split(",")] if args.buffers else [2 * concurrency, 1]
    print(f"{args.sessions} sessions, run concurrency {concurrency}, init `sleep {args.init_s}`, "
          f"harness `sleep {args.run_s}`")  # fmt: skip
    print(EXPLAIN)
    header = f"{'READY buffer':>12} {'gaps':>5} {'p50 ms':>8} {'mean ms':>8} {'max ms':>8} {'peak init+ready':>15}"
    print(f"{header} {'peak ready':>10} {'batch wall s':>12} {'client wall s':>13}  counts")
    results = {}
    for ready_buffer in buffers:
        result = results[ready_buffer] = _run(args, ready_buffer)
        gaps = result["gaps"] or [0.0]
        print(
            f"{ready_buffer:>12} {len(result['gaps']):>5} {statistics.median(gaps):>8.0f} "
            f"{statistics.fmean(gaps):>8.0f} {max(gaps):>8.0f} {result['peak']:>15} {result['ready']:>10} "
            f"{result['wall']:>12.2f} "
            f"{result['client_wall']:>13.2f}  "
            f"{result['counts']}"
        )
    base = buffers[0]
    for other in buffers[1:]:
        mean_base = statistics.fmean(results[base]["gaps"] or [0.0])
        mean_other = statistics.fmean(results[other]["gaps"] or [0.0])
        gap_ratio = mean_other / mean_base if mean_base else float("inf")
        wall_ratio = results[other]["wall"] / results[base]["wall"]
        print(f"buffer {other} vs {base}: mean gap x{gap_ratio:.1f}, batch wall x{wall_ratio:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
