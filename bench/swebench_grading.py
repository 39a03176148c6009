"""SWE-bench grading cost: what the ``swebench`` evaluator adds to a session in the Docker runtime.

Two batches of the same sessions on the tiny SWE-bench-format instance the tests use (``tests/swebench_repo.py``:
a Python repository with a failing test), each session's harness a shell command writing the right fix (no model:
this measures the runtime and grading, not a policy). One batch is graded by ``swebench`` (init also prepares the
clean runtime; postrun takes the diff, applies it there with the test patch, runs the tests and grades the log),
the other by ``session_completion`` (one runtime, nothing to grade). Per-stage seconds come from the
``stage_latencies`` view (postrun ends at the terminal state; teardown comes after). Needs Docker with
``polar-test:latest`` (``scripts/build-test-image.sh``), PostgreSQL (``POLAR_BENCH_ADMIN_DSN``) and Redis
(``POLAR_BENCH_REDIS``).

    python bench/swebench_grading.py [--sessions 6] [--run-concurrency 2]
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import psycopg
import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.swebench_repo, run from anywhere

from polar.client import PolarClient
from polar.local.launcher import Stack, free_port, pipeline_env, pipeline_specs
from polar.storage.migration import upgrade
from polar.storage.scratch import create_database, drop_database
from tests.swebench_repo import FIXED, TEST_CMD, SweRepo, build_swe_repo

ADMIN_DSN = os.environ.get("POLAR_BENCH_ADMIN_DSN", "postgresql://postgres@127.0.0.1:5432/test")
BROKER_URL = os.environ.get("POLAR_BENCH_REDIS", "redis://127.0.0.1:6379") + "/12"
STAGES = ("init_s", "run_s", "postrun_s", "total_s")


def _task(swe: SweRepo, evaluator: str, sessions: int) -> dict[str, Any]:
    config = {"instance": swe.instance, "repo_dir": ".", "test_cmd": TEST_CMD} if evaluator == "swebench" else {}
    return {
        "task_id": evaluator,
        "instruction": "fix mul",
        "num_samples": sessions,
        "runtime": {"backend": "docker", "prepare": swe.prepare_steps()},
        "harness": {"name": "command", "command": f"printf '%s' {shlex.quote(FIXED)} > calc.py"},
        "evaluator": {"name": evaluator, "config": config},
    }


def _latencies(database_url: str) -> list[dict[str, Any]]:
    query = (
        f"SELECT l.state, s.reward, {', '.join('l.' + stage for stage in STAGES)} "
        "FROM stage_latencies l JOIN sessions s ON s.id = l.session_id"
    )
    with psycopg.connect(database_url.replace("+psycopg", "")) as connection:
        cursor = connection.execute(query)
        names = [column.name for column in cursor.description or []]
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def _run(swe: SweRepo, evaluator: str, args: argparse.Namespace, tmp: Path) -> list[dict[str, Any]]:
    database_url = create_database(ADMIN_DSN, "polar_bench")
    upgrade(database_url)
    broker = redis.Redis.from_url(BROKER_URL)
    broker.flushdb()
    ports = {"engine": free_port(), "api": free_port(), "proxy": free_port()}
    state, sessions = tmp / evaluator / "state", tmp / evaluator / "sessions"
    env = {
        **pipeline_env(database_url, BROKER_URL, ports, state, args.run_concurrency, sessions),
        "POLAR_NODE": f"bench-{evaluator}",
        "POLAR_COPY_ROOTS": str(swe.path),  # the copy step reads the repository
    }
    specs = pipeline_specs(ports, "echo", (), args.run_concurrency, proxy_workers=1, proxy_threads=8)
    try:
        with Stack(specs, env, tmp / evaluator / "logs"):
            client = PolarClient(env["POLAR_API_URL"], env["POLAR_API_TOKEN"])
            try:
                batch_id = client.submit({"tasks": [_task(swe, evaluator, args.sessions)]})["batch_id"]
                client.wait(batch_id, timeout_s=600, poll_s=0.2)
            finally:
                client.close()
        return _latencies(database_url)
    finally:
        drop_database(ADMIN_DSN, database_url)
        broker.flushdb()
        broker.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=6)
    parser.add_argument("--run-concurrency", type=int, default=2)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="polar-bench-swebench-"))
    swe = build_swe_repo(tmp / "origin")
    print(f"{args.sessions} sessions per evaluator, Docker runtime, run concurrency {args.run_concurrency}; "
          "median seconds per stage (stage_latencies)")  # fmt: skip
    print(f"{'evaluator':<20} {'states':<16} {'rewards':<10} " + " ".join(f"{s:>10}" for s in STAGES))
    for evaluator in ("session_completion", "swebench"):
        rows = _run(swe, evaluator, args, tmp)
        states = sorted({row["state"] for row in rows})
        rewards = statistics.fmean(row["reward"] or 0.0 for row in rows)
        medians = [statistics.median(float(row[s]) for row in rows if row[s] is not None) for s in STAGES]
        print(f"{evaluator:<20} {','.join(states):<16} {rewards:<10.2f} " + " ".join(f"{m:>10.2f}" for m in medians))
    return 0


if __name__ == "__main__":
    sys.exit(main())
