"""Proxy overhead: the same chat requests sent straight to the reference engine (zero-delay ``echo`` policy)
and through the proxy with capture on (a Postgres insert per call), at concurrency 1 and 64.

Prints p50/p99 latency of each path, the added latency (proxied minus direct, per percentile), and the
throughput ratio. Needs PostgreSQL (``POLAR_BENCH_ADMIN_DSN``, default the local ``test`` database).

    python bench/proxy_overhead.py [--requests 2000] [--proxy-workers 2] [--proxy-threads 32]
    python bench/proxy_overhead.py --agent [--max-prompt-tokens 40000]
    python bench/proxy_overhead.py --long-session [--calls 300] [--turns 10]
    python bench/proxy_overhead.py --serving-core [--against ../before] [--runs 5]

``--agent`` replays one agent-shaped session instead: a 40-tool list (~20 KB of JSON schemas), a 1,200-word system
prompt, and a history that grows by the model's answer (64 tokens) and a 300-word tool result per call, to
``--max-prompt-tokens``; each call is sent straight to the engine and then through the proxy, streamed and not, with
TITO (``token_in_token_out``) off and on. Per prompt-size band it prints the added latency (p50), the proxy's own
time and its capture time (Server-Timing), the proxy workers' CPU per call (from /proc) and the bytes each call
stores in ``model_calls``. The deployment's first session (JSON, TITO off) is replayed before those four and shown
apart ("first"): a fresh proxy and database serve it ~0.5-1 ms a call slower than any later one.

``--long-session`` measures how a call's cost grows with the number of calls before it in its session (audit F18):
one session of ``--calls`` calls made of conversations of ``--turns`` turns each (the agent-shaped system prompt,
tools and tool results, then a fresh conversation of the same agent), TITO off and on. Every conversation has the
same shape, so the first conversation's calls (around call 10) and the last one's (around call 300) differ only by
how many calls the session held before them; it prints the proxy workers' CPU per call (mean over the
conversation) and the proxy's own time (Server-Timing, p50) for both, and their ratio. The proxy shares state
through Redis as deployed (``POLAR_BENCH_REDIS_URL``, default the local Redis's database 0).

``--serving-core`` measures what the proxy's gunicorn worker itself costs a request (HTTP/1.1 parsing, the hand-off
to a pool thread, the answer's framing), without the proxy behind it: one ``EpollWorker`` serving a WSGI app that
reads the body and answers 13 bytes, sent an OpenAI-SDK-shaped model call (17 header fields) with a small (1 KB) and
an agent-size (200 KB) body, over 1 and 16 keep-alive connections; the worker's CPU per request (from /proc), the
median of ``--runs``. With ``--against DIR`` (another checkout: ``git worktree add ../before <rev>``) both trees are
run alternately, run by run, and the ratio of each pair is shown.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg
import sqlalchemy as sa

from polar.config import load_config
from polar.contract.task_request import parse_batch_request
from polar.lifecycle.batches import request_hash, submit_batch
from polar.local.launcher import PROXY_WORKER, Stack, engine_spec, free_port, gunicorn_spec
from polar.proxy.keys import hash_key
from polar.services import Services
from polar.storage.database import Database
from polar.storage.migration import upgrade
from polar.storage.models import Session
from polar.storage.scratch import create_database, drop_database

ADMIN_DSN = os.environ.get("POLAR_BENCH_ADMIN_DSN", "postgresql://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("POLAR_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
BODY = {"model": "polar-reference", "messages": [{"role": "system", "content": "You are terse."},
                                       {"role": "user", "content": "Say something short."}]}  # fmt: skip


class _NoDispatch:
    def send(self, stage: object, session_id: object) -> None:
        """The benchmark makes its session running by hand; nothing is queued."""


def _running_session(url: str, tmp: Path, tito: bool = False) -> str:
    config = load_config({"POLAR_DATABASE_URL": url, "POLAR_READY_BUFFER": "0"}, cwd=tmp)
    services = Services(config, Database(url), _NoDispatch(), "bench")
    task = {"task_id": "bench", "instruction": "x", "harness": {"name": "command", "command": "true"}}
    # One session stands in for many harnesses at once: lift the per-session in-flight limit (default 16).
    body = {"tasks": [{**task, "token_in_token_out": tito, "max_concurrent_calls": 256}]}
    batch_id = submit_batch(services, parse_batch_request(body), request_hash(body)).batch_id
    key = "pk-bench-" + uuid.uuid4().hex
    with services.db.unit() as db:
        db.execute(
            sa.update(Session).where(Session.batch_id == batch_id).values(state="running", proxy_key_hash=hash_key(key))
        )
    services.db.dispose()
    return key


@dataclass(frozen=True)
class _Deployment:
    """The reference engine and the proxy (capturing to a throwaway database) the benchmark talks to."""

    stack: Stack
    database_url: str
    tmp: Path
    direct: str  # the engine's chat completions URL
    proxy: str  # the proxy's base URL

    def proxied(self, key: str) -> str:
        return f"{self.proxy}/s/{key}/v1/chat/completions"


@contextmanager
def _deployment(args: argparse.Namespace, engine_args: list[str]) -> Iterator[_Deployment]:
    tmp = Path(tempfile.mkdtemp(prefix="polar-bench-"))
    database_url = create_database(ADMIN_DSN, "polar_bench")
    try:
        upgrade(database_url)
        engine_port, proxy_port = free_port(), free_port()
        env = {"POLAR_DATABASE_URL": database_url, "POLAR_ENGINE_URLS": f"http://127.0.0.1:{engine_port}"}
        if args.long_session:
            env["POLAR_REDIS_URL"] = REDIS_URL
        specs = [
            engine_spec(engine_port, "echo", engine_args),
            gunicorn_spec(
                "proxy",
                "web.proxy:create_app()",
                proxy_port,
                args.proxy_workers,
                args.proxy_threads,
                args.proxy_worker_class,
            ),
        ]
        with Stack(specs, env, tmp / "logs") as stack:
            yield _Deployment(stack, database_url, tmp, f"http://127.0.0.1:{engine_port}/v1/chat/completions",
                              f"http://127.0.0.1:{proxy_port}")  # fmt: skip
    finally:
        drop_database(ADMIN_DSN, database_url)


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


# Pseudo-words from syllables: text that tokenizes like prose and compresses like it (a repeated handful of
# words would compress ~10x better than real prompts and flatter the stored bytes).
SYLLABLES = ["ka", "lo", "mi", "ter", "an", "dus", "ve", "ro", "pin", "sal", "eth", "or", "ub", "qua", "ne", "fi"]
WORDS = [a + b + c for a in SYLLABLES for b in SYLLABLES for c in ("", "s", "ing", "ed")]
BANDS = ((0, 8_000), (8_000, 16_000), (16_000, 24_000), (24_000, 40_000))


def _text(words: int, seed: int) -> str:
    return " ".join(random.Random(seed).choices(WORDS, k=words))


def _tools(count: int = 40) -> list[dict[str, Any]]:
    """A Claude-Code-sized tool list: ~20 KB of JSON schemas."""
    properties = {f"arg_{j}": {"type": "string", "description": _text(12, j)} for j in range(5)}
    return [{"type": "function", "function": {"name": f"tool_{i}", "description": _text(30, i),
             "parameters": {"type": "object", "properties": properties, "required": ["arg_0"]}}}
            for i in range(count)]  # fmt: skip


def _cpu_seconds(master_pid: int) -> float:
    """User + system CPU of the proxy's gunicorn workers (the master's children)."""
    ticks = os.sysconf("SC_CLK_TCK")
    children = Path(f"/proc/{master_pid}/task/{master_pid}/children").read_text().split()
    total = 0
    for pid in children:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / ticks


# The OpenAI Python SDK's head for a model call, as it sends it (--serving-core).
SDK_HEAD = (
    "POST /s/pk-{key}/v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAccept-Encoding: gzip, deflate\r\n"
    "Connection: keep-alive\r\nAccept: application/json\r\nContent-Type: application/json\r\n"
    "User-Agent: OpenAI/Python 1.99.0\r\nX-Stainless-Lang: python\r\nX-Stainless-Package-Version: 1.99.0\r\n"
    "X-Stainless-OS: Linux\r\nX-Stainless-Arch: x64\r\nX-Stainless-Runtime: CPython\r\n"
    "X-Stainless-Runtime-Version: 3.11.7\r\nAuthorization: Bearer pk-{key}\r\nX-Stainless-Async: false\r\n"
    "x-stainless-retry-count: 0\r\nx-stainless-read-timeout: 600\r\nContent-Length: {length}\r\n\r\n"
)
CORE_APP = """
def app(environ, start_response):
    size = len(environ["wsgi.input"].read())
    start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", "13")])
    return [b'{"n":%7d}' % size]
"""
CORE_SHAPES = ((1, 1000), (16, 1000), (1, 200_000), (16, 200_000))  # (connections, body bytes)


def _core_cpu_us(root: Path, app_dir: Path, connections: int, size: int, requests: int) -> float:
    """Worker CPU per request, in µs, of one EpollWorker of ``root``'s tree serving ``requests`` model-call-shaped
    requests of ``size`` body bytes over ``connections`` keep-alive connections (after 200 not counted)."""
    port = free_port()
    argv = [sys.executable, "-m", "gunicorn", "--bind", f"127.0.0.1:{port}", "--workers", "1", "--threads", "16",
            "--worker-class", "web.gunicorn_worker.EpollWorker", "--keep-alive", "60", "core_app:app"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{app_dir}"}
    server = subprocess.Popen(argv, cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    prefix, suffix = b'{"model":"m","messages":[{"role":"user","content":"', b'"}]}'
    body = prefix + b"x" * (size - len(prefix) - len(suffix)) + suffix
    request = SDK_HEAD.format(key="a" * 32, port=port, length=len(body)).encode() + body

    def send(count: int) -> None:
        deadline = time.monotonic() + 60
        while True:
            try:
                conn = socket.create_connection(("127.0.0.1", port))
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        with conn:
            for _ in range(count):
                conn.sendall(request)
                answer = b""
                while not answer.endswith(b"}"):
                    answer += conn.recv(65536)

    try:
        send(200)
        cpu = _cpu_seconds(server.pid)
        clients = [threading.Thread(target=send, args=(requests // connections,)) for _ in range(connections)]
        for client in clients:
            client.start()
        for client in clients:
            client.join()
        return (_cpu_seconds(server.pid) - cpu) / (requests // connections * connections) * 1e6
    finally:
        server.terminate()
        server.wait(30)


def _serving_core(args: argparse.Namespace) -> int:
    trees = [("this tree", Path(__file__).resolve().parents[1])]
    if args.against:
        trees.append(("against", Path(args.against).resolve()))
    runs: dict[tuple[str, int, int], list[float]] = {}
    with tempfile.TemporaryDirectory() as app_dir:
        (Path(app_dir) / "core_app.py").write_text(CORE_APP)
        for _ in range(args.runs):
            for connections, size in CORE_SHAPES:
                requests = 10_000 if size < 10_000 else 2_000
                for label, root in trees:  # in turn, so a drift in the machine's speed falls on both
                    runs.setdefault((label, connections, size), []).append(
                        _core_cpu_us(root, Path(app_dir), connections, size, requests)
                    )
    print(f"EpollWorker CPU per request (µs, median of {args.runs}; {os.cpu_count()} cores): "
          + ", ".join(f"{label} {root}" for label, root in trees))  # fmt: skip
    print(f"{'connections':>11} {'body':>8} " + " ".join(f"{label:>10}" for label, _ in trees)
          + ("   ratio (pairwise median)" if args.against else ""))  # fmt: skip
    for connections, size in CORE_SHAPES:
        cells = [runs[(label, connections, size)] for label, _ in trees]
        line = f"{connections:>11} {size:>8} " + " ".join(f"{statistics.median(cell):>10.0f}" for cell in cells)
        if args.against:
            line += f"   {statistics.median(a / b for a, b in zip(cells[0], cells[1], strict=True)):.3f}"
        print(line)
    return 0


def _stored_bytes(database_url: str) -> list[int]:
    query = """SELECT coalesce(pg_column_size(request), 0) + coalesce(pg_column_size(normalized_request), 0)
                      + coalesce(pg_column_size(response), 0) + pg_column_size(prompt_token_ids)
                      + pg_column_size(completion_token_ids) + pg_column_size(logprobs)
               FROM model_calls ORDER BY created_at"""
    with psycopg.connect(database_url.replace("+psycopg", "")) as connection:
        return [row[0] for row in connection.execute(query).fetchall()]


def _replay(deployment: _Deployment, max_prompt_tokens: int, stream: bool, tito: bool) -> list[dict[str, float]]:
    """One agent session, call by call: direct then proxied, with what each proxied call cost."""
    database_url = deployment.database_url
    direct = deployment.direct
    proxied = deployment.proxied(_running_session(database_url, deployment.tmp, tito))
    before_calls = len(_stored_bytes(database_url))
    task = "Fix the failing test in the repository."
    messages: list[dict[str, Any]] = [{"role": "system", "content": _text(1200, 0)}, {"role": "user", "content": task}]
    tools, rows = _tools(), []
    master = deployment.stack.processes["proxy"].pid
    with httpx.Client(timeout=120) as client:
        for turn in range(200):
            body = {"model": "polar-reference", "messages": messages, "tools": tools, "stream": stream}
            if stream:
                body["stream_options"] = {"include_usage": True}
            for _ in range(2):  # the second, warm (the engine has seen this prompt), is the one subtracted
                started = time.perf_counter()
                with client.stream("POST", direct, json=body) as response:
                    response.read()
                direct_ms = (time.perf_counter() - started) * 1000
            started = time.perf_counter()
            with client.stream("POST", direct, json={**body, **CAPTURE, "stream": False}) as response:
                response.read()
            ids_ms = (time.perf_counter() - started) * 1000 - direct_ms
            cpu = _cpu_seconds(master)
            started = time.perf_counter()
            with client.stream("POST", proxied, json=body) as response:
                response.read()
            proxied_ms = (time.perf_counter() - started) * 1000  # where the direct calls' clocks stop too
            timing = dict(re.findall(r"(\w+);dur=([\d.]+)", response.headers.get("server-timing", "")))
            if response.status_code != 200:
                raise SystemExit(f"proxy answered {response.status_code}: {response.text[:500]}")
            usage = _usage(response.text, stream)
            rows.append({
                "prompt_tokens": usage["prompt_tokens"],
                "added_ms": proxied_ms - direct_ms,
                "ids_ms": ids_ms,
                "engine_ms": float(timing.get("engine", 0)) - direct_ms,
                "proxy_ms": float(timing.get("proxy", 0)) - float(timing.get("engine", 0)),
                "capture_ms": float(timing.get("capture", 0)),
                "cpu_ms": (_cpu_seconds(master) - cpu) * 1000,
            })  # fmt: skip
            if usage["prompt_tokens"] >= max_prompt_tokens:
                break
            messages += [{"role": "assistant", "content": usage["content"]},
                         {"role": "user", "content": "Tool result: " + _text(300, turn)}]  # fmt: skip
    for row, size in zip(rows, _stored_bytes(database_url)[before_calls:], strict=False):
        row["stored_bytes"] = size
    return rows


def _usage(text: str, stream: bool) -> dict[str, Any]:
    """Prompt tokens and the answer's text, from a response body or an SSE stream (with usage in its last chunk)."""
    if not stream:
        body = json.loads(text)
        return {"prompt_tokens": body["usage"]["prompt_tokens"], "content": body["choices"][0]["message"]["content"]}
    content, prompt_tokens = [], 0
    for line in text.splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices") or []:
                content.append((choice.get("delta") or {}).get("content") or "")
            if chunk.get("usage"):
                prompt_tokens = chunk["usage"]["prompt_tokens"]
    return {"prompt_tokens": prompt_tokens, "content": "".join(content)}


def _agent_report(rows: list[dict[str, float]], label: str) -> None:
    for low, high in BANDS:
        band = [r for r in rows if low <= r["prompt_tokens"] < high]
        if not band:
            continue
        median = {k: statistics.median(r[k] for r in band if k in r) for k in band[0]}
        median["cpu_ms"] = statistics.fmean(r["cpu_ms"] for r in band)  # /proc counts 10 ms ticks: a mean, not p50
        print(f"{label:>18} {f'{low // 1000}k-{high // 1000}k':>9} {len(band):>5} {median['added_ms']:>9.1f} "
              f"{median['proxy_ms']:>9.1f} {median['capture_ms']:>10.1f} {median['cpu_ms']:>8.1f} "
              f"{median.get('stored_bytes', 0) / 1024:>10.1f} {median['ids_ms']:>7.1f} "
              f"{median['engine_ms']:>8.1f}")  # fmt: skip


def _agent(args: argparse.Namespace) -> int:
    with _deployment(args, ["--policy-config", '{"tokens": 64}', "--max-model-len", "131072"]) as deployment:
        proxy = f"gunicorn {args.proxy_worker_class} {args.proxy_workers}x{args.proxy_threads}"
        print(f"agent replay: sessions to {args.max_prompt_tokens} prompt tokens, 40 tools, engine echo 64 "
              f"tokens zero delay; proxy {proxy}; {os.cpu_count()} cores")  # fmt: skip
        print(f"{'session':>18} {'prompt':>9} {'calls':>5} {'added ms':>9} {'proxy ms':>9} {'capture ms':>10} "
              f"{'CPU ms':>8} {'stored KiB':>10} {'ids ms':>7} {'engine Δ':>8}")  # fmt: skip
        print(
            "p50 per band; CPU: mean; ids: the engine asked for token ids and logprobs, as the proxy asks, less the "
            "direct call; engine Δ: the proxy's engine request (Server-Timing engine) less the direct call"
        )
        print("goal: added p50 <= 5 ms for 32k-token calls, once the deployment has served a session ('first': before)")
        # A deployment's first agent session runs ~0.5-1 ms a call slower than every later one (docs/benchmarks.md,
        # at agent size): it is shown apart, as the small-call run keeps its 20 warm-up calls out of its figures.
        _agent_report(_replay(deployment, args.max_prompt_tokens, False, False), "first: json, off")
        for stream in (False, True):
            for tito in (False, True):
                label = f"{'stream' if stream else 'json'}, TITO {'on' if tito else 'off'}"
                if args.sessions and label.replace(", TITO ", "-") not in args.sessions:
                    continue
                rows = _replay(deployment, args.max_prompt_tokens, stream, tito)
                _agent_report(rows, label)
    return 0


def _long_session(deployment: _Deployment, calls: int, turns: int, tito: bool) -> list[dict[str, float]]:
    """One session of ``calls`` calls, a fresh conversation every ``turns`` turns; what each call cost."""
    proxied = deployment.proxied(_running_session(deployment.database_url, deployment.tmp, tito))
    master = deployment.stack.processes["proxy"].pid
    tools, rows, system = _tools(), [], _text(1200, 0)
    messages: list[dict[str, Any]] = []
    with httpx.Client(timeout=120) as client:
        for number in range(calls):
            if number % turns == 0:
                messages = [{"role": "system", "content": system}, {"role": "user", "content": f"Task {number}"}]
            cpu = _cpu_seconds(master)
            response = client.post(proxied, json={"model": "polar-reference", "messages": messages, "tools": tools})
            if response.status_code != 200:
                raise SystemExit(f"proxy answered {response.status_code}: {response.text[:500]}")
            timing = dict(re.findall(r"(\w+);dur=([\d.]+)", response.headers.get("server-timing", "")))
            rows.append({"cpu_ms": (_cpu_seconds(master) - cpu) * 1000,
                         "proxy_ms": float(timing.get("proxy", 0)) - float(timing.get("engine", 0))})  # fmt: skip
            content = response.json()["choices"][0]["message"]["content"]
            messages += [{"role": "assistant", "content": content},
                         {"role": "user", "content": "Tool result: " + _text(300, number)}]  # fmt: skip
    return rows


def _long(args: argparse.Namespace) -> int:
    with _deployment(args, ["--policy-config", '{"tokens": 64}', "--max-model-len", "131072"]) as deployment:
        proxy = f"gunicorn {args.proxy_worker_class} {args.proxy_workers}x{args.proxy_threads}"
        print(f"long session: {args.calls} calls, a new {args.turns}-turn conversation of the same agent each "
              f"{args.turns} calls (40 tools, 1,200-word system prompt); engine echo 64 tokens zero delay; proxy "
              f"{proxy} with Redis; {os.cpu_count()} cores")  # fmt: skip
        print(f"{'TITO':>5} {'calls':>11} {'CPU ms/call':>12} {'proxy ms p50':>13}")
        print(f"goal: with TITO, CPU per call around call {args.calls} within 1.5x of around call {args.turns}")
        for tito in (False, True):
            _long_session(deployment, 2 * args.turns, args.turns, tito)  # warm the workers (first calls load code)
            rows = _long_session(deployment, args.calls, args.turns, tito)
            first, last = rows[: args.turns], rows[-args.turns :]
            cpu = [statistics.fmean(r["cpu_ms"] for r in part) for part in (first, last)]
            for part, label, mean in ((first, f"1-{args.turns}", cpu[0]),
                                      (last, f"{args.calls - args.turns + 1}-{args.calls}", cpu[1])):  # fmt: skip
                proxy_ms = statistics.median(r["proxy_ms"] for r in part)
                print(f"{'on' if tito else 'off':>5} {label:>11} {mean:>12.1f} {proxy_ms:>13.1f}")
            print(f"{'on' if tito else 'off':>5} {'ratio':>11} {cpu[1] / cpu[0]:>12.2f}")
    return 0


def _percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=1000, method="inclusive")[int(q * 10) - 1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--proxy-workers", type=int, default=2)
    parser.add_argument("--proxy-threads", type=int, default=32)
    parser.add_argument("--proxy-worker-class", default=PROXY_WORKER,
                        help=f"gunicorn's -k for the proxy (default {PROXY_WORKER}; or gthread)")  # fmt: skip
    parser.add_argument("--agent", action="store_true", help="Replay agent-sized sessions (see above).")
    parser.add_argument("--max-prompt-tokens", type=int, default=40_000,
                        help="With --agent: each session ends with its first call this long.")  # fmt: skip
    parser.add_argument(
        "--sessions",
        type=lambda text: text.split(","),
        default=None,
        help="With --agent: only these of json-off,json-on,stream-off,stream-on (default: all).",
    )
    parser.add_argument("--long-session", action="store_true", help="One long session's cost per call (see above).")
    parser.add_argument("--calls", type=int, default=300, help="With --long-session: the session's calls.")
    parser.add_argument("--turns", type=int, default=10, help="With --long-session: turns per conversation.")
    parser.add_argument("--serving-core", action="store_true", help="The worker's own CPU a request (see above).")
    parser.add_argument("--against", help="With --serving-core: another checkout to run alternately with this one.")
    parser.add_argument("--runs", type=int, default=5, help="With --serving-core: runs of each shape and tree.")
    args = parser.parse_args()
    if args.serving_core:
        return _serving_core(args)
    if args.agent:
        return _agent(args)
    if args.long_session:
        return _long(args)
    with _deployment(args, ["--policy-config", '{"tokens": 16}']) as deployment:
        direct = deployment.direct
        proxied = deployment.proxied(_running_session(deployment.database_url, deployment.tmp))
        setup = f"gunicorn {args.proxy_worker_class} {args.proxy_workers}x{args.proxy_threads}, capture to Postgres"
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
                cpu = _cpu_seconds(deployment.stack.processes["proxy"].pid)
                latencies, throughput = asyncio.run(_load(url, concurrency, args.requests, body, timings))
                if name == "proxied":  # the warm-up calls count too: 20 more than timed
                    cpu_ms = (_cpu_seconds(deployment.stack.processes["proxy"].pid) - cpu) * 1000
                    timings["proxy CPU per call"] = [cpu_ms / (args.requests + min(20, args.requests))]
                results[name] = (_percentile(latencies, 50), _percentile(latencies, 99), throughput)
                print(f"{concurrency:>11} {name:>10} {results[name][0]:>8.2f} {results[name][1]:>8.2f} "
                      f"{throughput:>8.0f}")  # fmt: skip
            added50 = results["proxied"][0] - results["direct"][0]
            added99 = results["proxied"][1] - results["direct"][1]
            ratio = results["proxied"][2] / results["direct"][2]
            goal = "   goal: added p50 <= 2 ms, proxy CPU <= 1 ms a call" if concurrency == 1 else ""
            print(
                f"{concurrency:>11} {'added':>10} {added50:>8.2f} {added99:>8.2f}   throughput ratio {ratio:.2f}" + goal
            )
            errors = len(timings.pop("transport_errors", []))
            inside = ", ".join(f"{k} {statistics.median(v):.2f}" for k, v in timings.items())
            if errors:
                print(f"{'':>11} transport errors (connection reset between client and server): {errors}")
            print(f"{'':>11} inside the proxy (Server-Timing p50 ms; CPU: the gunicorn workers'): {inside}")
        with psycopg.connect(deployment.database_url.replace("+psycopg", "")) as connection:
            stored = connection.execute("SELECT count(*) FROM model_calls").fetchone()
        print(f"calls captured: {stored[0] if stored else 0}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
