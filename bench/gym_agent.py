"""The NeMo Gym agent under NeMo RL's load: a whole training batch of ``/run`` calls at once (NeMo RL's sync GRPO
sends e.g. 64 prompts x 16 generations = 1,024 rows in one go and sets no client timeout), and what the waiting
costs the agent process.

It starts ``python -m web.gym`` on a throwaway Postgres database with Redis db 14 as the broker but no workers, so
the agent's own work is all that is measured: the bench posts ``--rows`` rows at once, waits until every row's
session is submitted, samples the agent's threads and resident memory while they all wait, then captures one
model call per session and settles every session in one transaction, and times each answer from that moment.

    python bench/gym_agent.py [--rows 1024] [--threads 8] [--poll 0.25]

Prints: submission rate, the agent's threads and RSS while the rows wait (and idle, before), and the time from
settlement to answer (p50 / p99 / max) with every answer's status.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import redis
import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout, for bench.*

from bench.deployment import ADMIN_DSN
from polar.config import load_config
from polar.local.launcher import free_port
from polar.storage.calls.write import CallRecord, record_call
from polar.storage.database import Database
from polar.storage.migration import upgrade
from polar.storage.models import Session
from polar.storage.scratch import scratch_database

REDIS = os.environ.get("POLAR_BENCH_REDIS", "redis://127.0.0.1:6379")
REDIS_DB = 14
TEMPLATE = '{"instruction": {{ instruction | tojson }}, "harness": {"name": "command", "command": "true"}}'


def _row(index: int) -> dict[str, Any]:
    return {"responses_create_params": {"input": f"Question {index}: what is {index} + 1?"},
            "agent_ref": {"type": "responses_api_agents", "name": "polar"}, "_ng_task_index": index // 16,
            "_ng_rollout_index": index % 16, "_rowidx": index}  # fmt: skip


def _process(pid: int) -> tuple[int, float]:
    """Threads and resident MB of ``pid``."""
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return int(status["Threads"]), int(status["VmRSS"].split()[0]) / 1024


async def _post_all(url: str, rows: list[dict[str, Any]], answered: dict[int, float]) -> list[int]:
    """Every row at once on one aiohttp session, as NeMo Gym's client sends them (no timeout, no connection cap
    below the batch)."""
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout()) as session:

        async def one(row: dict[str, Any]) -> int:
            async with session.post(f"{url}/run", json=row) as response:
                await response.read()
                answered[row["_rowidx"]] = time.perf_counter()
                return response.status

        return await asyncio.gather(*(one(row) for row in rows))


def _settle(db: Database) -> float:
    """Capture one call per session, then settle them all in one transaction; the moment it committed."""
    with db.unit() as unit:
        ids = list(unit.scalars(sa.select(Session.id)))
        unit.execute(sa.update(Session).values(state="running"))
    for index, session_id in enumerate(ids):
        prompt, completion = [1, 2, 3, index % 1000 + 4], [7, 8, 9]
        response = {"id": f"c{index}", "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                    "token_ids": completion}], "prompt_token_ids": prompt}  # fmt: skip
        record_call(db, CallRecord(
            session_id=session_id, agent=None, provider="openai_chat", model="m", stream=False,
            prompt_token_ids=prompt, completion_token_ids=completion, logprobs=[-0.1] * 3, finish_reason="stop",
            status_code=200, latency_ms=1.0, engine_latency_ms=1.0, engine_url=None, policy_version=None,
            request={"messages": []}, normalized_request={"messages": []}, response=response,
        ))  # fmt: skip
    with db.unit() as unit:
        unit.execute(sa.update(Session).values(state="completed", outcome="exited", outcome_class="task", reward=1.0))
    return time.perf_counter()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--poll", type=float, default=0.25)
    args = parser.parse_args()
    broker = f"{REDIS}/{REDIS_DB}"
    print(f"gym agent: {args.rows:,} rows posted at once, {args.threads} threads, poll {args.poll} s, "
          f"{os.cpu_count()} cores")  # fmt: skip
    with scratch_database(ADMIN_DSN, "polar_bench_gym") as url:
        upgrade(url)
        workdir = Path(os.environ.get("TMPDIR", "/tmp")) / "polar-bench-gym"
        workdir.mkdir(exist_ok=True)
        template = workdir / "task.template.json"
        template.write_text(TEMPLATE)
        env = {**os.environ, "POLAR_DATABASE_URL": url, "POLAR_BROKER_URL": broker, "POLAR_READY_BUFFER": "0",
               "POLAR_STATE_DIR": str(workdir / "state")}  # fmt: skip
        port = free_port()
        command = [sys.executable, "-m", "web.gym", "--template", str(template), "--port", str(port),
                   "--threads", str(args.threads), "--poll", str(args.poll)]  # fmt: skip
        agent = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL)
        agent_url = f"http://127.0.0.1:{port}"
        db = Database(load_config({**env}).database_url)
        try:
            while True:
                try:
                    httpx.get(f"{agent_url}/", timeout=1).raise_for_status()
                    break
                except httpx.HTTPError:
                    time.sleep(0.2)
            idle_threads, idle_rss = _process(agent.pid)
            rows = [_row(i) for i in range(args.rows)]
            answered: dict[int, float] = {}
            statuses: list[list[int]] = []
            started = time.perf_counter()
            poster = threading.Thread(target=lambda: statuses.append(asyncio.run(_post_all(agent_url, rows, answered))))
            poster.start()
            peak_threads, peak_rss = idle_threads, idle_rss
            while True:
                with db.unit() as unit:
                    submitted = unit.scalar(sa.select(sa.func.count()).select_from(Session))
                threads, rss = _process(agent.pid)
                peak_threads, peak_rss = max(peak_threads, threads), max(peak_rss, rss)
                if submitted >= args.rows:
                    break
                time.sleep(0.1)
            submit_s = time.perf_counter() - started
            waiting = httpx.get(f"{agent_url}/").json()["waiting"]
            threads, rss = _process(agent.pid)
            peak_threads, peak_rss = max(peak_threads, threads), max(peak_rss, rss)
            settled_at = _settle(db)
            poster.join()
            latencies = sorted((at - settled_at) * 1000 for at in answered.values())
            codes = {code: statuses[0].count(code) for code in set(statuses[0])}
            print(f"submitted {args.rows:,} rows in {submit_s:.1f} s ({args.rows / submit_s:.0f} rows/s)")
            print(
                f"agent idle: {idle_threads} threads, {idle_rss:.0f} MB; with {waiting:,} rows waiting: "
                f"{threads} threads, {rss:.0f} MB (peak while submitting: {peak_threads} threads, {peak_rss:.0f} MB)"
            )
            print(f"settlement -> answer: p50 {statistics.median(latencies):.0f} ms, "
                  f"p99 {latencies[int(len(latencies) * 0.99) - 1]:.0f} ms, max {latencies[-1]:.0f} ms; "
                  f"statuses {json.dumps(codes)}")  # fmt: skip
        finally:
            agent.terminate()
            agent.wait(timeout=30)
            db.dispose()
            redis.Redis.from_url(broker).flushdb()


if __name__ == "__main__":
    main()
