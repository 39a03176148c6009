"""``polar demo`` on embedded defaults (SQLite, the filesystem broker), as ``make demo`` runs it on a fresh
machine: a small batch end to end, a reward table, and a trajectories file."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.processes import HANG_GUARD_S, process_alive


def test_demo_runs_end_to_end_on_embedded_defaults(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLAR_")}
    result = subprocess.run(
        [sys.executable, "-m", "polar", "demo", "--tasks", "2", "--samples", "2", "--out", "out.jsonl"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"export POLAR_API_TOKEN=[\w-]{43}\n", result.stdout), result.stdout  # generated, shown
    summary = re.search(r"4 sessions, 4 completed, (\d) correct", result.stdout)
    assert summary, result.stdout
    assert re.search(r"arith-00 +17 \* 23 +391 +\d/2 ", result.stdout) and "arith-01" in result.stdout
    assert (tmp_path / ".polar" / "polar.db").exists()
    lines = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert len(lines) == 8  # two calls per session, per_request
    for line in lines:
        assert len(line["token_ids"]) == len(line["loss_mask"]) == len(line["logprobs"])
        assert line["reward"] in (0.0, 1.0)  # test_on_output: the right answer or not
    assert sum(line["reward"] for line in lines) == 2 * int(summary.group(1))


def test_up_stays_up_and_stops_cleanly(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLAR_")}
    log = (tmp_path / "up.log").open("w+")
    up = subprocess.Popen([sys.executable, "-m", "polar", "up"], cwd=tmp_path, env=env, stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 90
        while "Polar is up" not in (tmp_path / "up.log").read_text():
            assert up.poll() is None and time.monotonic() < deadline, (tmp_path / "up.log").read_text()
            time.sleep(0.2)
        api = re.search(r"API (http://\S+)", (tmp_path / "up.log").read_text()).group(1)  # type: ignore[union-attr]
        assert httpx.get(f"{api}/healthz", timeout=HANG_GUARD_S).json() == {"status": "ok"}
        token = re.search(r"export POLAR_API_TOKEN=(\S+)", (tmp_path / "up.log").read_text())
        assert token, (tmp_path / "up.log").read_text()
        engine = f"{api}/v1/engine"
        assert httpx.get(engine, timeout=HANG_GUARD_S).status_code == 401  # a token was generated: never open
        authorized = {"Authorization": f"Bearer {token.group(1)}"}
        assert httpx.get(engine, headers=authorized, timeout=HANG_GUARD_S).status_code == 200
        children = [
            int(p) for p in subprocess.run(["pgrep", "-P", str(up.pid)], capture_output=True, text=True).stdout.split()
        ]
        assert len(children) == 5  # engine, api, proxy, the two worker pools (prep and run)
    finally:
        up.send_signal(signal.SIGTERM)
        up.wait(timeout=30)
        log.close()
    assert up.returncode == 0
    assert not any(process_alive(pid) for pid in children)
