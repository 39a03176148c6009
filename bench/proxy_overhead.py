"""Proxy overhead: the same chat requests sent straight to the reference engine (zero-delay ``echo`` policy)
and through the proxy with capture on (a Postgres insert per call), at concurrency 1 and 64.

Prints p50/p99 latency of each path, the added latency (proxied minus direct, per percentile), and the
throughput ratio. Needs PostgreSQL (``POLAR_BENCH_ADMIN_DSN``, default the local ``test`` database).

    python bench/proxy_overhead.py [--requests 2000] [--proxy-workers 2] [--proxy-threads 32]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import psycopg
import sqlalchemy as sa

from polar.config import load_config
from polar.launcher import Stack, engine_spec, free_port, gunicorn_spec
from polar.lifecycle.batches import request_hash, submit_batch
from polar.proxy.keys import hash_key
from polar.services import Services
from polar.storage.database import Database
from polar.storage.migration import upgrade
from polar.storage.models import Session
from polar.storage.scratch import create_database, drop_database
from polar.task_request import parse_batch_request

ADMIN_DSN = os.environ.get("POLAR_BENCH_ADMIN_DSN", "postgresql://postgres@127.0.0.1:5432/test")
BODY = {"model": "polar-reference", "messages": [{"role": "system", "content": "You are terse."},
                                       {"role": "user", "content": "Say something short."}]}  # fmt: skip


class _NoDispatch:
    def send(self, stage: object, session_id: object) -> None:
        """The benchmark makes its session running by hand; nothing is queued."""


def _running_session(url: str, tmp: Path) -> str:
    config = load_config({"POLAR_DATABASE_URL": url, "POLAR_READY_BUFFER": "0"}, cwd=tmp)
    services = Services(config, Database(url), _NoDispatch(), "bench")
    body = {"tasks": [{"task_id": "bench", "instruction": "x", "harness": {"name": "command", "command": "true"}}]}
    batch_id = submit_batch(services, parse_batch_request(body), request_hash(body)).batch_id
    key = "pk-bench-" + uuid.uuid4().hex
    with services.db.unit() as db:
        db.execute(
            sa.update(Session).where(Session.batch_id == batch_id).values(state="running", proxy_key_hash=hash_key(key))
        )
    services.db.dispose()
    return key


CAPTURE = {"return_token_ids": True, "logprobs": True, "top_logprobs": 0}


async def _load(
    url: str, concurrency: int, total: int, body: dict, timings: dict[str, list[float]]
) -> tuple[list[float], float]:
    latencies: list[float] = []
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(limits=limits, timeout=60) as client:
        for _ in range(min(20, total)):  # warm connections and caches
            (await client.post(url, json=body)).raise_for_status()
        remaining = total

        async def worker() -> None:
            nonlocal remaining
            while remaining > 0:
                remaining -= 1
                started = time.perf_counter()
                try:
                    response = await client.post(url, json=body)
                except httpx.TransportError:
                    timings.setdefault("transport_errors", []).append(1.0)
                    continue
                latencies.append((time.perf_counter() - started) * 1000)
                response.raise_for_status()
                for name, value in re.findall(r"(\w+);dur=([\d.]+)", response.headers.get("server-timing", "")):
                    timings.setdefault(name, []).append(float(value))

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    return latencies, total / elapsed


def _percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=1000, method="inclusive")[int(q * 10) - 1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--proxy-workers", type=int, default=2)
    parser.add_argument("--proxy-threads", type=int, default=32)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="polar-bench-"))
    database_url = create_database(ADMIN_DSN, "polar_bench")
    upgrade(database_url)
    engine_port, proxy_port = free_port(), free_port()
    env = {"POLAR_DATABASE_URL": database_url, "POLAR_ENGINE_URLS": f"http://127.0.0.1:{engine_port}"}
    specs = [
        engine_spec(engine_port, "echo", ["--policy-config", '{"tokens": 16}']),
        gunicorn_spec("proxy", "web.proxy:create_app()", proxy_port, args.proxy_workers, args.proxy_threads),
    ]
    try:
        with Stack(specs, env, tmp / "logs"):
            key = _running_session(database_url, tmp)
            direct = f"http://127.0.0.1:{engine_port}/v1/chat/completions"
            proxied = f"http://127.0.0.1:{proxy_port}/s/{key}/v1/chat/completions"
            setup = f"gunicorn gthread {args.proxy_workers}x{args.proxy_threads}, capture to Postgres"
            print(f"{args.requests} requests per run; engine: echo policy, 16 tokens, zero delay; proxy: {setup}")
            print(f"{'concurrency':>11} {'path':>10} {'p50 ms':>8} {'p99 ms':>8} {'req/s':>8}")
            for concurrency in (1, 64):
                results = {}
                timings: dict[str, list[float]] = {}
                runs = (
                    ("direct", direct, BODY),
                    ("direct+ids", direct, {**BODY, **CAPTURE}),
                    ("proxied", proxied, BODY),
                )
                for name, url, body in runs:
                    latencies, throughput = asyncio.run(_load(url, concurrency, args.requests, body, timings))
                    results[name] = (_percentile(latencies, 50), _percentile(latencies, 99), throughput)
                    print(f"{concurrency:>11} {name:>10} {results[name][0]:>8.2f} {results[name][1]:>8.2f} "
                          f"{throughput:>8.0f}")  # fmt: skip
                added50 = results["proxied"][0] - results["direct"][0]
                added99 = results["proxied"][1] - results["direct"][1]
                ratio = results["proxied"][2] / results["direct"][2]
                print(f"{concurrency:>11} {'added':>10} {added50:>8.2f} {added99:>8.2f}   throughput ratio {ratio:.2f}")
                errors = len(timings.pop("transport_errors", []))
                inside = ", ".join(f"{k} {statistics.median(v):.2f}" for k, v in timings.items())
                if errors:
                    print(f"{'':>11} transport errors (connection reset between client and server): {errors}")
                print(f"{'':>11} inside the proxy (Server-Timing p50 ms): {inside}")
            with psycopg.connect(database_url.replace("+psycopg", "")) as connection:
                stored = connection.execute("SELECT count(*) FROM model_calls").fetchone()
            print(f"calls captured: {stored[0] if stored else 0}")
    finally:
        drop_database(ADMIN_DSN, database_url)
    return 0


if __name__ == "__main__":
    sys.exit(main())
