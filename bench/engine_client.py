"""The proxy's engine request on its own: CPU and wall time per small chat completion sent to the reference engine
(zero-delay ``echo`` policy) through Polar's keep-alive client (``polar.fleet.engine_http``), httpx, and urllib3
when it is installed, alternating, with the token-capture switches the proxy sends.

    python bench/engine_client.py [--requests 1500] [--rounds 2]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout, for bench.*
from bench.proxy_overhead import BODY as SMALL_BODY
from bench.proxy_overhead import CAPTURE
from polar.fleet.engine_http import EngineHttp, Origin
from polar.local.launcher import Stack, engine_spec, free_port

# What the proxy sends the engine for a small call: the benchmark's body with the capture switches.
BODY = {**SMALL_BODY, **CAPTURE, "stream": False}
HEADERS = {"Content-Type": "application/json"}


def _clients(base: str) -> dict[str, Callable[[], object]]:
    polar_client, origin = EngineHttp(connect_timeout_s=5.0, read_timeout_s=60.0), Origin.of(base)
    httpx_client = httpx.Client(timeout=60)
    clients: dict[str, Callable[[], object]] = {
        "polar engine_http": lambda: orjson.loads(
            polar_client.request(origin, "POST", "/v1/chat/completions", orjson.dumps(BODY))[1]
        ),
        "httpx": lambda: orjson.loads(
            httpx_client.post(base + "/v1/chat/completions", content=orjson.dumps(BODY), headers=HEADERS).content
        ),
    }
    try:
        import urllib3
    except ImportError:
        return clients
    pool = urllib3.PoolManager(retries=False, timeout=urllib3.Timeout(connect=5.0, read=60.0))
    clients["urllib3"] = lambda: orjson.loads(
        pool.request("POST", base + "/v1/chat/completions", body=orjson.dumps(BODY), headers=HEADERS).data
    )
    return clients


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1500)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    port = free_port()
    with Stack([engine_spec(port, "echo", ["--policy-config", '{"tokens": 16}'])], {}, Path(tempfile.mkdtemp())):
        clients = _clients(f"http://127.0.0.1:{port}")
        print(f"{args.requests} requests per run, one connection kept alive; engine: echo policy, 16 tokens")
        print(f"{'round':>5} {'client':>18} {'CPU us/request':>15} {'wall us/request':>16}")
        for round_ in range(1, args.rounds + 1):
            for name, send in clients.items():
                for _ in range(50):  # warm the connection and the engine
                    send()
                cpu, wall = time.process_time(), time.perf_counter()
                for _ in range(args.requests):
                    send()
                cpu_us = (time.process_time() - cpu) * 1e6 / args.requests
                wall_us = (time.perf_counter() - wall) * 1e6 / args.requests
                print(f"{round_:>5} {name:>18} {cpu_us:>15.0f} {wall_us:>16.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
