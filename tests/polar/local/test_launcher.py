"""``polar.local.launcher``: every deployment it describes carries an API token, since the API refuses to start without
one."""

from __future__ import annotations

import socket
from pathlib import Path

from polar.local.launcher import _ephemeral_range, free_port, new_api_token, pipeline_env, port_is_free

PORTS = {"engine": 1, "api": 2, "proxy": 3}


def test_pipeline_env_carries_a_fresh_token_unless_given_one(tmp_path: Path) -> None:
    first = pipeline_env("sqlite://", "memory://", PORTS, tmp_path, 2)["POLAR_API_TOKEN"]
    second = pipeline_env("sqlite://", "memory://", PORTS, tmp_path, 2)["POLAR_API_TOKEN"]
    assert len(first) >= 32 and first != second
    given = pipeline_env("sqlite://", "memory://", PORTS, tmp_path, 2, api_token="t" * 40)
    assert given["POLAR_API_TOKEN"] == "t" * 40


def test_new_tokens_are_long_and_url_safe() -> None:
    tokens = {new_api_token() for _ in range(20)}
    assert len(tokens) == 20
    assert all(len(t) >= 43 and t.replace("-", "").replace("_", "").isalnum() for t in tokens)


def test_every_stage_worker_serves_its_metrics_on_a_port_of_its_own() -> None:
    from polar.local.launcher import NodeSpec, gunicorn_spec, metrics_urls, pipeline_specs, stage_workers

    specs = pipeline_specs(PORTS, "echo", (), 2, nodes=[NodeSpec("a"), NodeSpec("b")])
    urls = metrics_urls(specs)
    assert set(urls) == {f"{node}-worker-{stage}" for node in "ab" for stage in ("init", "ready", "run", "postrun")}
    assert len(set(urls.values())) == 8 and all(url.endswith("/metrics") for url in urls.values())
    assert specs[-1].env["POLAR_NODE"] == "b"  # the node's own settings are kept beside the port
    assert metrics_urls(stage_workers(2, metrics=False)) == {}
    # gunicorn with Polar's settings, so /metrics adds up every worker process.
    assert "python:web.gunicorn_conf" in gunicorn_spec("api", "web.api:create_app()", 1).argv
    # The proxy runs on its own worker (web/gunicorn_worker.py), the API on gthread.
    assert "web.gunicorn_worker.EpollWorker" in gunicorn_spec("proxy", "web.proxy:create_app()", 1).argv
    assert "gthread" in gunicorn_spec("api", "web.api:create_app()", 1).argv


def test_the_prep_and_run_layout_gives_every_stage_queue_one_pool_and_keeps_the_run_slots() -> None:
    from polar.local.launcher import stage_workers

    specs = {spec.name: spec for spec in stage_workers(3, layout="prep-and-run")}
    assert set(specs) == {"worker-prep", "worker-run"}

    def option(spec, flag: str) -> str:  # type: ignore[no-untyped-def]
        return str(spec.argv[spec.argv.index(flag) + 1])

    assert option(specs["worker-prep"], "--queues") == "init,ready,postrun"
    assert option(specs["worker-run"], "--queues") == "run"
    # The run pool's threads are the node's run slots; the prep pool has the threads of the three stages it serves.
    assert option(specs["worker-run"], "--concurrency") == "3"
    assert option(specs["worker-prep"], "--concurrency") == str(3 + 2 + 2)
    assert option(specs["worker-prep"], "--hostname") == "prep@%h"


def test_a_stack_never_takes_another_stacks_server_for_its_own(tmp_path: Path) -> None:
    # Two stacks picked the same port: the second one's engine cannot bind it, and its start says so instead of
    # reading the first one's health check as its own (its sessions would have gone to a stranger's engine).
    import pytest

    from polar.local.launcher import Stack, engine_spec, free_port

    port = free_port()
    with Stack([engine_spec(port, "echo")], {}, tmp_path / "first"):
        second = Stack([engine_spec(port, "echo")], {}, tmp_path / "second")
        with pytest.raises(RuntimeError, match="engine exited"):
            second.start(timeout_s=60)


def test_embedded_stacks_started_at_once_claim_different_ports() -> None:
    from polar.local.embedded import _port
    from polar.local.launcher import free_port

    preferred = free_port()
    first, second = _port(preferred), _port(preferred)
    assert first == preferred and second != preferred  # the claim on the preferred port is held by the first


def test_free_ports_come_from_outside_the_range_client_connections_take_theirs_from() -> None:
    # A port from bind(0) is one the kernel also gives a client's connection, which can take it before the server
    # binds (a reference engine died on EADDRINUSE in a stressed run); below the ephemeral range only servers bind.
    low, _ = _ephemeral_range()
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == 50  # never the same one twice to one process
    assert all(1024 <= port < low and port_is_free(port) for port in ports)
    with socket.create_server(("127.0.0.1", ports[0])) as server:
        with socket.create_connection(server.getsockname()) as client:
            assert client.getsockname()[1] >= low  # where a client's port comes from
        assert not port_is_free(ports[0])


def test_a_start_waits_as_long_as_its_slowest_process_may_take(tmp_path: Path) -> None:
    # The wait is a hang guard per process: the torch engine (torch imported, weights loaded) and real vLLM get
    # longer than the rest; a process that never gets ready fails the start once its own guard is past.
    import sys

    import pytest

    from polar.local.launcher import TORCH_START_S, VLLM_START_S, ProcessSpec, Stack, engine_spec

    assert engine_spec(1, backend="torch").start_s == TORCH_START_S > ProcessSpec.start_s
    assert engine_spec(1, None, backend="vllm").start_s == VLLM_START_S
    never = ProcessSpec("never", [sys.executable, "-c", "import time; time.sleep(60)"], ready_line="ready", start_s=0.5)
    stack = Stack([never], {}, tmp_path / "logs")
    with pytest.raises(RuntimeError, match=r"never not healthy after 0.5s"):
        stack.start()
