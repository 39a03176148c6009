"""A sandbox reaches the proxy and nothing else: from inside a ``bwrap`` and a ``docker`` session, a harness that
tries Postgres, Redis, the API and the engine (on loopback and on the host's other addresses) reaches none of
them, while its model call through the proxy is answered and captured. The same probe in the ``local`` runtime,
which does not isolate, reaches them: the probe can tell."""

from __future__ import annotations

import base64
import socket
import sys
from pathlib import Path
from urllib.parse import urlsplit

from tests.docker_engine import require_docker_image
from tests.stacks import RunningStack
from tests.stage_calls import command_task

PROBE = Path(__file__).with_name("agents") / "sandbox_probe.py"


def host_addresses() -> list[str]:
    """This machine's non-loopback IPv4 addresses (its own interface and Docker's bridge, when there)."""
    found = set()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("10.255.255.255", 1))  # no packet is sent: it only picks the outgoing interface
            found.add(probe.getsockname()[0])
        except OSError:
            pass
    found.add("172.17.0.1")
    return sorted(address for address in found if not address.startswith("127."))


def services(stack: RunningStack) -> list[str]:
    ports = [5432, 6379, urlsplit(stack.api_url).port, urlsplit(stack.engine_url).port]
    return [f"127.0.0.1:{port}" for port in ports] + [f"{host}:{port}" for host in host_addresses() for port in ports]


def probe_task(backend: str, targets: list[str]) -> dict[str, object]:
    source = base64.b64encode(PROBE.read_bytes()).decode()
    code = f"import base64, sys; sys.argv[0] = 'probe'; exec(base64.b64decode('{source}'))"
    command = f'{sys.executable} -c "{code}" {" ".join(targets)}'
    return command_task(f"probe-{backend}", command, runtime={"backend": backend}, timeout_seconds=120)


def test_a_sandboxed_harness_reaches_the_proxy_and_nothing_else(shared_stack: RunningStack) -> None:
    require_docker_image()
    stack = shared_stack
    tasks = [probe_task(backend, services(stack)) for backend in ("bwrap", "docker", "local")]
    submitted = stack.client.submit({"tasks": tasks})
    stack.wait(submitted["batch_id"])
    sessions = {s["task_id"]: s for s in stack.client.sessions(submitted["batch_id"])}
    for backend in ("bwrap", "docker"):
        session = sessions[f"probe-{backend}"]
        assert session["state"] == "completed" and session["exit_code"] == 0, (backend, session["error"])
        (call,) = stack.client.calls(session["session_id"])
        assert call["status_code"] == 200 and call["completion_token_ids"]
    # The local runtime does not isolate, and the probe can tell.
    local = sessions["probe-local"]
    assert local["exit_code"] == 3, local["error"]
    assert "127.0.0.1:5432: REACHED" in local["error"]
