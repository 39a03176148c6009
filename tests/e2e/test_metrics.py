"""Prometheus metrics and Flower end to end, on one stack in the production layout (a worker per stage queue, as
compose runs it). The API's and the proxy's ``/metrics`` (gunicorn, two proxy workers whose
numbers must add up) and each stage worker's own endpoint scrape cleanly with ``prometheus_client``'s parser
before and after a batch, and the series move by exactly what the batch did: the proxy's calls, phases and tokens
match the captured calls, the call-limit refusal is counted, all four stages counted their tasks, the sessions
are shown completed. Flower, started against the stack's broker while a batch runs, shows the workers of all four
queues and the stage tasks of that batch through its own HTTP API, behind basic auth: nothing without the
credentials."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from polar.config import load_config
from polar.local.launcher import free_port, metrics_urls
from polar.observability import group_dir
from tests.conftest import redis_database
from tests.processes import HANG_GUARD_S, wait_until
from tests.prometheus import Scrape, scrape
from tests.stacks import RunningStack, running_stack
from tests.stage_calls import command_task

REPO = str(Path(__file__).resolve().parents[2])
STAGES = ("init", "ready", "run", "postrun")
USER, PASSWORD = "ops", "flower-password"


@pytest.fixture(scope="module")
def stack(module_database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningStack]:
    tmp = tmp_path_factory.mktemp("metrics")
    with (
        redis_database() as broker,
        running_stack(
            module_database_url, broker, tmp, env={"POLAR_PLUGIN_MODULES": "tests.e2e"}, layout="per-stage"
        ) as running,
    ):
        yield running


def calculator(samples: int) -> dict:
    return {"task_id": "calc", "instruction": "What is 17 * 23?", "num_samples": samples, "timeout_seconds": 120,
            "harness": {"name": "python", "command": "polar.agents.calculator:run"}}  # fmt: skip


def runaway() -> dict:
    """Asks three times, allowed one call: the second is refused with a 429 (and the harness exits 0)."""
    env = {"PYTHONPATH": REPO, "LOOP_CALLS": "3", "LOOP_EXPECT_ANSWERS": "1"}
    return {"task_id": "runaway", "instruction": "Say something.", "timeout_seconds": 120, "max_calls": 1,
            "harness": {"name": "python", "command": "tests.e2e.agents.looping:run", "env": env}}  # fmt: skip


def scrape_all(stack: RunningStack) -> dict[str, Scrape]:
    """Every endpoint, by process name; each must parse, and every series is Polar's."""
    urls = {"api": f"{stack.api_url}/metrics", "proxy": f"{stack.proxy_url}/metrics",
            **metrics_urls(list(stack.stack.specs.values()))}  # fmt: skip
    scrapes = {name: scrape(url, stack.api_headers if name == "api" else None) for name, url in urls.items()}
    for name, found in scrapes.items():
        assert all(family.startswith("polar_") for family in found.families), (name, sorted(found.families))
    return scrapes


def test_every_endpoint_scrapes_and_the_series_move_with_a_batch(stack: RunningStack) -> None:
    assert httpx.get(f"{stack.api_url}/metrics", timeout=HANG_GUARD_S).status_code == 401  # the API's takes a token
    before = scrape_all(stack)
    assert set(before) == {"api", "proxy", *(f"worker-{stage}" for stage in STAGES)}
    assert before["proxy"].value("polar_proxy_requests_total") == 0
    assert before["proxy"].has("polar_engine_inflight_calls", engine=stack.engine_url)
    assert before["api"].value("polar_database_up") == 1 and before["api"].value("polar_broker_up") == 1
    assert before["api"].value("polar_sessions") == 0

    submitted = stack.client.submit({"name": "metrics", "tasks": [calculator(2), runaway()]})
    final = stack.wait(submitted["batch_id"])
    sessions = list(stack.client.sessions(submitted["batch_id"]))
    assert final["counts"] == {"completed": 3}, [s["error"] for s in sessions]
    calls = [call for s in sessions for call in stack.client.calls(s["session_id"])]
    answered = [call for call in calls if call["status_code"] == 200]
    assert len(answered) >= 3

    # The proxy: two gunicorn workers, one sum. Every answered call counted, timed in each phase, its tokens added.
    proxy = scrape_all(stack)["proxy"]
    assert proxy.value("polar_proxy_requests_total", protocol="openai_chat", operation="generate", status="200") == (
        len(answered)
    )
    assert proxy.value("polar_proxy_requests_total", status="429") == 1
    assert proxy.value("polar_proxy_rejected_calls_total", protocol="openai_chat", reason="max_calls") == 1
    for phase in ("engine", "capture", "proxy", "total"):
        count = proxy.value("polar_proxy_request_duration_seconds_count", protocol="openai_chat", phase=phase)
        assert count == len(answered), phase
    assert proxy.value("polar_proxy_request_duration_seconds_sum", phase="total") > 0
    assert proxy.value("polar_proxy_prompt_tokens_total") == sum(len(c["prompt_token_ids"]) for c in answered)
    assert proxy.value("polar_proxy_completion_tokens_total") == sum(len(c["completion_token_ids"]) for c in answered)
    assert proxy.value("polar_engine_inflight_calls", engine=stack.engine_url) == 0

    # The API's view of the deployment (read again once its short cache has expired).
    def completed() -> Scrape | None:
        api = scrape_all(stack)["api"]
        return api if api.value("polar_sessions", state="completed") == 3 else None

    api = wait_until(completed, timeout_s=120, message="the API's metrics to show 3 completed sessions")
    assert api.value("polar_sessions") == 3
    (node,) = api.labels("polar_node_up", "node")
    assert api.value("polar_node_up", node=node) == 1
    assert api.value("polar_ready_buffer_capacity", node=node) == 4  # twice the run concurrency
    assert api.value("polar_ready_buffer_sessions", node=node) == 0
    assert api.value("polar_queue_messages", queue="init") == 0 and api.has("polar_queue_messages", queue=f"run.{node}")
    assert api.value("polar_api_requests_total", endpoint="batches.create", method="POST", status="201") == 1

    # Each stage's worker: every session went through its stage, on this node, none raised.
    def stages_done() -> dict[str, Scrape] | None:
        found = scrape_all(stack)
        settled = all(
            found[f"worker-{stage}"].value("polar_stage_tasks_in_progress") == 0
            and found[f"worker-{stage}"].value("polar_stage_tasks_total", stage=stage, outcome="ok") >= 3
            for stage in STAGES
        )
        return found if settled else None

    workers = wait_until(stages_done, timeout_s=120, message="every stage worker to count its tasks")
    for stage in STAGES:
        found = workers[f"worker-{stage}"]
        assert found.labels("polar_stage_tasks_total", "node") == {node}, stage
        assert found.value("polar_stage_tasks_total", stage=stage, outcome="error") == 0, stage
        assert found.value("polar_stage_duration_seconds_count", stage=stage) == found.value(
            "polar_stage_tasks_total", stage=stage
        )
        assert found.labels("polar_stage_tasks_total", "stage") == {stage}  # one endpoint per worker

    # Each process group wrote to its own directory under the state directory.
    groups = {path.name.split("-")[0] for path in (Path(stack.env["POLAR_STATE_DIR"]) / "metrics").iterdir()}
    assert groups == {"api", "proxy", "worker"}


def test_each_gunicorn_master_has_its_own_control_socket(stack: RunningStack) -> None:
    """gunicorn's default control socket is one path per user: the API, the proxy and every other stack of the
    machine would bind it in turn. Each master's is in its own metrics directory and answers for that master."""
    client_module = pytest.importorskip("gunicorn.ctl.client", reason="gunicorn before 25.1 has no control socket")
    config = load_config(stack.env)
    workers = {}
    for service, url in (("api", stack.api_url), ("proxy", stack.proxy_url)):
        port = url.rpartition(":")[2]
        path = group_dir(config, service, port) / "gunicorn.ctl"
        with client_module.ControlClient(str(path), timeout=HANG_GUARD_S) as client:
            listeners = client.send_command("show listeners")["listeners"]
            workers[service] = {worker["pid"] for worker in client.send_command("show workers")["workers"]}
        assert [listener["address"] for listener in listeners] == [f"http://127.0.0.1:{port}"], service
    assert workers["api"] and workers["proxy"] and not workers["api"] & workers["proxy"]


def test_flower_sees_every_stage(stack: RunningStack, tmp_path: Path) -> None:
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
