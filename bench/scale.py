"""Large batches on the domain functions and a real Postgres: how long the operations a trainer runs against a big
batch take. Each figure is measured on a throwaway database (``POLAR_BENCH_ADMIN_DSN``, default the local ``test``
database) with a batch of ``--sessions`` sessions submitted with a READY bound of 0, so every one is pending (no
workers, no broker: the stage messages go nowhere).

    python bench/scale.py [--sessions 10000] [--repeat 3]

- cancel: ``POST /v1/batches/<id>/cancel``'s domain function on a batch whose sessions are all unstarted (every
  one ends ``cancelled`` with its event and feed position). Goal: <= 1 s for 10k.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

from polar.config import load_config
from polar.lifecycle.batches import request_hash, submit_batch
from polar.lifecycle.cancel import cancel_batch
from polar.lifecycle.dispatch import Stage
from polar.services import Services
from polar.storage.database import Database
from polar.storage.migration import upgrade
from polar.storage.scratch import scratch_database
from polar.task_request import parse_batch_request

ADMIN_DSN = os.environ.get("POLAR_BENCH_ADMIN_DSN", "postgresql://postgres@127.0.0.1:5432/test")


class _Nowhere:
    """No broker: a bench of the database work only."""

    def send(self, stage: Stage, session_id: uuid.UUID, node: str | None = None) -> None:
        pass


def _services(url: str, workdir: Path) -> Services:
    env = {"POLAR_DATABASE_URL": url, "POLAR_BROKER_URL": "memory://", "POLAR_READY_BUFFER": "0"}
    return Services(load_config(env, cwd=workdir), Database(url), _Nowhere(), "bench")


def _batch(sessions: int) -> dict:
    samples = 100
    tasks = [
        {
            "task_id": f"t{i}",
            "instruction": "x",
            "num_samples": samples,
            "harness": {"name": "command", "command": "true"},
        }
        for i in range(sessions // samples)
    ]
    return {"tasks": tasks}


def cancel_seconds(sessions: int, repeat: int, workdir: Path) -> list[float]:
    """Seconds to cancel a batch of ``sessions`` unstarted sessions, once per repetition (a fresh database each)."""
    figures = []
    for _ in range(repeat):
        with scratch_database(ADMIN_DSN, "polar_bench_scale") as url:
            upgrade(url)
            services = _services(url, workdir)
            body = _batch(sessions)
            batch_id = submit_batch(services, parse_batch_request(body), request_hash(body)).batch_id
            started = time.perf_counter()
            result = cancel_batch(services, batch_id)
            figures.append(time.perf_counter() - started)
            assert result.cancelled == sessions, result
            services.db.dispose()
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    workdir = Path(os.environ.get("TMPDIR", "/tmp"))
    print(f"scale: {args.sessions} sessions per batch, {os.cpu_count()} cores, median of {args.repeat}")
    cancel = cancel_seconds(args.sessions, args.repeat, workdir)
    print(f"{'figure':<42} {'measured':>10} {'goal':>8}")
    goal = 1.0 * args.sessions / 10_000
    median = statistics.median(cancel)
    print(f"{f'cancel {args.sessions} unstarted sessions':<42} {median:>9.3f}s {goal:>7.1f}s  (runs: "
          + ", ".join(f"{s:.3f}" for s in cancel) + ")")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
