"""Flower, started against the test broker while a batch runs, shows the workers of all four queues and the
stage tasks of that batch through its own HTTP API, behind basic auth (as compose runs it): nothing without the
credentials."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.support import command_task, free_port, running_stack, wait_until

pytestmark = pytest.mark.long(seconds=35)  # dealt out first, longest first (tests/conftest.py)

USER, PASSWORD = "ops", "flower-password"


def test_flower_sees_every_stage(database_url: str, broker_url: str, tmp_path: Path) -> None:
    # The production layout, a worker per stage queue, as compose runs it (docs/operations.md).
    with running_stack(database_url, broker_url, tmp_path, layout="per-stage") as stack:
        port = free_port()
        flower_log = (tmp_path / "flower.log").open("wb")
        flower = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "workers", "flower", f"--port={port}", "--address=127.0.0.1"],
            env={**stack.env, "PATH": "/usr/bin:/bin", "FLOWER_BASIC_AUTH": f"{USER}:{PASSWORD}"},
            stdout=flower_log,
            stderr=subprocess.STDOUT,
        )
        api = f"http://127.0.0.1:{port}/api"
        try:
            wait_until(lambda: _get(f"{api}/workers?refresh=true"), timeout_s=120, message="flower to answer")
            for url in (f"http://127.0.0.1:{port}/", f"{api}/workers", f"{api}/tasks"):
                assert httpx.get(url, timeout=10).status_code == 401, url
                assert httpx.get(url, timeout=10, auth=(USER, "wrong")).status_code == 401, url
                assert httpx.get(url, timeout=10, auth=(USER, PASSWORD)).status_code == 200, url
            submitted = stack.client.submit({"tasks": [command_task("f", "true", samples=2)]})
            stack.wait(submitted["batch_id"])
            session_ids = [s["session_id"] for s in stack.client.sessions(submitted["batch_id"])]

            workers = wait_until(lambda: _workers_with_queues(api), timeout_s=120, message="workers in flower")
            queues = {q["name"] for w in workers.values() for q in w.get("active_queues") or []}
            assert {"init", "ready", "run", "postrun"} <= queues

            def stage_tasks() -> set[tuple[str, str]] | None:
                tasks = _get(f"{api}/tasks?limit=1000") or {}
                seen = {(t["name"], s) for t in tasks.values() for s in session_ids if s in str(t.get("args"))}
                return seen if len(seen) == 8 else None

            seen = wait_until(stage_tasks, timeout_s=180, message="the batch's stage tasks in flower")
            assert {name for name, _ in seen} == {"polar.init", "polar.ready", "polar.run", "polar.postrun"}
        finally:
            flower.terminate()
            try:
                flower.wait(timeout=10)
            except subprocess.TimeoutExpired:  # a loaded machine: don't let clean-up hide the test's own failure
                flower.kill()
                flower.wait()
            flower_log.close()


def _get(url: str) -> dict | None:
    try:
        response = httpx.get(url, timeout=10, auth=(USER, PASSWORD))
    except httpx.HTTPError:
        return None
    return response.json() if response.status_code == 200 else None


def _workers_with_queues(api: str) -> dict | None:
    workers = _get(f"{api}/workers?refresh=true") or {}
    return workers if len([w for w in workers.values() if w.get("active_queues")]) >= 4 else None
