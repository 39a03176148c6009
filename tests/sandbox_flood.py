"""A hostile sandbox against its relay, for ``tests/e2e/test_sandbox_flood.py`` and ``bench/sandbox_flood.py``.

Inside a ``bwrap`` sandbox a harness opens ``slow`` connections straight to its proxy socket (skipping the
forwarder) that trickle a request head a byte every half second, then ``idle`` more that it holds without sending
anything. Meanwhile another session calls the proxy; its latencies are taken before and during the flood, and the
run worker's (this process's) threads are counted throughout.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field

import httpx

from polar.config import Config
from polar.contract.task_request import RuntimeSpec
from polar.runtimes import create_runtime

FLOOD = r"""
import os, resource, socket, sys, time
slow, idle, key = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
resource.setrlimit(resource.RLIMIT_NOFILE, (resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2)
def opened():
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect("/run/polar-proxy/proxy.sock")
    return conn
head = f"POST /s/{key}/v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n".encode()
trickling = [opened() for _ in range(slow)]
held = [opened() for _ in range(idle)]
open("flood.status", "w").write(f"{len(trickling)} {len(held)}")
sent = 0
while not os.path.exists("flood.stop"):
    for conn in trickling:
        try:
            conn.send(head[sent:sent + 1])
        except OSError:
            pass
    sent = (sent + 1) % len(head)
    time.sleep(0.5)
"""
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
HANG_GUARD_S = 120


def threads() -> int:
    """This process's threads (the relay runs here, as it does in a run worker)."""
    return len(os.listdir("/proc/self/task"))


@dataclass
class Figures:
    quiet_ms: list[float] = field(default_factory=list)
    flood_ms: list[float] = field(default_factory=list)
    statuses: list[int] = field(default_factory=list)
    threads_before: int = 0
    threads_peak: int = 0
    opened: str = ""

    def p50(self, samples: list[float]) -> float:
        return statistics.median(samples) if samples else float("nan")

    def report(self) -> str:
        quiet, flood = self.p50(self.quiet_ms), self.p50(self.flood_ms)
        return (
            f"sandbox held (trickling, idle) connections: {self.opened}\n"
            f"other session's calls: p50 quiet {quiet:.1f} ms, during the flood {flood:.1f} ms "
            f"({flood / quiet:.2f}x); statuses during the flood {sorted(set(self.statuses))}\n"
            f"run worker threads: {self.threads_before} before, {self.threads_peak} at most during the flood"
        )


def _calls(client: httpx.Client, url: str, count: int, into: list[float], figures: Figures) -> None:
    for _ in range(count):
        started = time.perf_counter()
        answer = client.post(url, json=BODY)
        into.append((time.perf_counter() - started) * 1000)
        figures.statuses.append(answer.status_code)
        figures.threads_peak = max(figures.threads_peak, threads())


def flood(
    proxy_url: str, attacker_key: str, victim_key: str, config: Config, slow: int = 130, idle: int = 5000,
    calls: int = 20,
) -> Figures:  # fmt: skip
    """Run the flood; the figures it gave."""
    figures = Figures()
    url = f"{proxy_url}/s/{victim_key}/v1/chat/completions"
    runtime = create_runtime(uuid.uuid4(), RuntimeSpec(backend="bwrap"), config)
    work = runtime.session_dir / "work"
    (work / "flood.py").write_text(FLOOD)
    try:
        with httpx.Client(timeout=HANG_GUARD_S) as client:
            _calls(client, url, calls, [], figures)  # warm: connections, caches
            _calls(client, url, calls, figures.quiet_ms, figures)
            figures.statuses.clear()
            with runtime.proxy_access(proxy_url) as access:
                figures.threads_before = figures.threads_peak = threads()
                command = [sys.executable, "flood.py", str(slow), str(idle), attacker_key]
                harness = threading.Thread(
                    target=runtime.exec, args=(access.wrap(command), {"PATH": "/usr/bin:/bin"}, HANG_GUARD_S, "flood"),
                    daemon=True,
                )  # fmt: skip
                harness.start()
                status = work / "flood.status"
                deadline = time.monotonic() + HANG_GUARD_S
                while not status.exists() and time.monotonic() < deadline:
                    figures.threads_peak = max(figures.threads_peak, threads())
                    time.sleep(0.05)
                figures.opened = status.read_text() if status.exists() else "never finished opening"
                _calls(client, url, calls, figures.flood_ms, figures)
                (work / "flood.stop").write_text("")
                harness.join(HANG_GUARD_S)
    finally:
        runtime.destroy()
    return figures


KEY_FLOOD = r"""
import json, os, socket, sys, threading, time, uuid
rate, seconds, workers = int(sys.argv[1]), float(sys.argv[2]), 8
statuses, lock = {}, threading.Lock()
def send():
    key = "pk-" + uuid.uuid4().hex
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(30)
    try:
        conn.connect("/run/polar-proxy/proxy.sock")
        conn.sendall(f"GET /s/{key}/v1/models HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        status = conn.recv(65536).split(b" ", 2)[1].decode() or "none"
    except OSError as exc:
        status = type(exc).__name__
    finally:
        conn.close()
    with lock:
        statuses[status] = statuses.get(status, 0) + 1
def work(index):
    start = time.monotonic()
    sent = 0
    while (now := time.monotonic()) - start < seconds:
        due = start + sent * workers / rate  # this worker's share of the pace
        if now < due:
            time.sleep(due - now)
        send()
        sent += 1
open("flood.status", "w").write("started")
threads = [threading.Thread(target=work, args=(i,)) for i in range(workers)]
[t.start() for t in threads]
[t.join() for t in threads]
open("flood.result", "w").write(json.dumps(statuses))
"""


def key_flood(proxy_url: str, attacker_key: str, victim_key: str, config: Config, rate: int = 1000,
              seconds: float = 8.0) -> tuple[dict[str, int], list[int]]:  # fmt: skip
    """A bwrap sandbox (the attacker's session, behind its relay) sending ``rate`` made-up proxy keys a second for
    ``seconds`` while a session the proxy has not seen yet (``victim_key``) makes its first calls: the flood's
    statuses by code, and the victim's."""
    from polar.contract.proxy_routes import hash_key

    url = f"{proxy_url}/s/{victim_key}/v1/chat/completions"
    runtime = create_runtime(uuid.uuid4(), RuntimeSpec(backend="bwrap"), config)
    work = runtime.session_dir / "work"
    (work / "key_flood.py").write_text(KEY_FLOOD)
    victim: list[int] = []
    try:
        with runtime.proxy_access(proxy_url, key_hash=hash_key(attacker_key)) as access:
            command = [sys.executable, "key_flood.py", str(rate), str(seconds)]
            harness = threading.Thread(
                target=runtime.exec, args=(access.wrap(command), {"PATH": "/usr/bin:/bin"}, HANG_GUARD_S, "flood"),
                daemon=True,
            )  # fmt: skip
            harness.start()
            deadline = time.monotonic() + HANG_GUARD_S
            while not (work / "flood.status").exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(1.0)  # the flood at its pace before the victim's first call
            with httpx.Client(timeout=HANG_GUARD_S) as client:
                while harness.is_alive() and len(victim) < 40:
                    victim.append(client.post(url, json=BODY).status_code)
            harness.join(HANG_GUARD_S)
        result = work / "flood.result"
        return (json.loads(result.read_text()) if result.exists() else {}), victim
    finally:
        runtime.destroy()
