"""schemathesis against the live rollout API, driven by the API's own ``/openapi.json``: no 5xx, every response
matches the documented schema and status codes, what the schema calls invalid is refused.

One stack for the module. A real batch (model calls, merged trajectories, a reward) runs first, and half of the
positive cases that name a batch or a session name that one, so 200 responses with real rows are checked against
the schema too, not only 404s. Fuzzed batches that the API accepts would start sessions: they run in bubblewrap
(``POLAR_DEFAULT_RUNTIME``, and ``local`` turned into ``bwrap``), Docker is out of reach, at most two samples and
five seconds each; the last test cancels them all and checks that every one ends.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import settings
from schemathesis.config import SchemathesisConfig
from schemathesis.specs.openapi.checks import positive_data_acceptance

from tests.processes import HANG_GUARD_S, wait_until
from tests.stacks import RunningStack, running_stack

pytestmark = pytest.mark.long(seconds=75)  # dealt out first, longest first (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[2]
READ_TOKEN = "openapi-read-token-" + "r" * 24
MAX_SAMPLES, MAX_TIMEOUT_S, MAX_WAIT_S = 2, 5, 0.2
REAL_BATCH = {
    "name": "openapi-real",
    "tasks": [
        {
            "task_id": "mul",
            "instruction": "What is 17 * 23? Use the calculator tool, then answer.",
            "num_samples": 2,
            "timeout_seconds": 120,
            "runtime": {"backend": "local"},
            "reconstruction": "prefix_merging",
            "harness": {"name": "python", "command": "polar.agents.calculator:run"},
            "evaluator": {
                "name": "test_on_output",
                "config": {"answer": {"expected": "391", "match": "numeric", "pattern": "answer is\\s*(-?[\\d.,]+)"}},
            },
        }
    ],
}
# Acceptance of a schema-valid batch depends on the deployment (which runtimes, harness CLIs and evaluators it has,
# POLAR_COPY_ROOTS, POLAR_CALLBACK_ALLOW) and on checks JSON Schema cannot state (printable task ids, the command
# harness needing a command): a valid-looking batch may get a 400 that names why, which is right.
DEPLOYMENT_DEPENDENT = {("POST", "/v1/batches"): [positive_data_acceptance]}


@pytest.fixture(scope="module")
def stack(
    module_database_url: str, module_broker_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningStack]:
    tmp = tmp_path_factory.mktemp("openapi")
    env = {
        "POLAR_DEFAULT_RUNTIME": "bwrap",
        "DOCKER_HOST": f"unix://{tmp}/no-docker.sock",
        "POLAR_API_READ_TOKEN": READ_TOKEN,
    }
    with running_stack(module_database_url, module_broker_url, tmp, env=env) as running:
        yield running


@pytest.fixture(scope="module")
def real(stack: RunningStack) -> dict[str, str]:
    """A finished batch with calls and trajectories: its id, and one of its sessions'."""
    batch_id = stack.client.submit(REAL_BATCH, idempotency_key="openapi-real")["batch_id"]
    assert stack.wait(batch_id)["counts"] == {"completed": 2}
    session_id = next(stack.client.sessions(batch_id))["session_id"]
    assert stack.client.calls(session_id) and stack.client.trajectories(session_id)
    return {"batch_id": batch_id, "session_id": session_id}


@pytest.fixture(scope="module")
def api_schema(stack: RunningStack, real: dict[str, str]) -> Any:
    # The checkout's schemathesis.toml, as the CLI in docs/api.md reads it: gunicorn's 414 for a request line too
    # long for it (documented) counts as the refusal it is.
    config = SchemathesisConfig.from_path(str(ROOT / "schemathesis.toml"))
    schema = schemathesis.openapi.from_url(f"{stack.api_url}/openapi.json", config=config)  # served without a token
    assert "414" in schema.config.checks.negative_data_rejection.expected_statuses
    schema.config.generation.update(max_examples=10, deterministic=True)  # per operation; 20 took twice as long
    return schema


schema = schemathesis.pytest.from_fixture("api_schema")


@pytest.fixture(autouse=True)
def _node_id_for_schemathesis(request: pytest.FixtureRequest) -> None:
    # schemathesis's pytest integration (4.32) reads and rewrites Node._nodeid, which pytest 9.2 no longer has.
    request.node._nodeid = request.node.nodeid


def _confine(task: Any) -> None:
    """Keep an accepted fuzzed task small, short and sandboxed (values stay schema-valid)."""
    if not isinstance(task, dict):
        return
    samples = task.get("num_samples")
    if isinstance(samples, int) and not isinstance(samples, bool) and samples > MAX_SAMPLES:
        task["num_samples"] = MAX_SAMPLES
    timeout = task.get("timeout_seconds")
    if isinstance(timeout, int | float) and not isinstance(timeout, bool) and timeout > MAX_TIMEOUT_S:
        task["timeout_seconds"] = MAX_TIMEOUT_S
    runtime = task.get("runtime")
    if isinstance(runtime, dict) and runtime.get("backend") == "local":
        runtime["backend"] = "bwrap"


def _point_at_real_rows(case: Any, real: dict[str, str]) -> None:
    """Half of the positive cases (by the generated UUID's parity) name the real batch or session instead."""
    for where in (case.path_parameters, case.query):
        for name in ("batch_id", "session_id"):
            value = (where or {}).get(name)
            try:
                even = uuid.UUID(str(value)).int % 2 == 0
            except ValueError:
                continue
            if even:
                where[name] = real[name]


def _adapt(case: Any, real: dict[str, str]) -> None:
    if case.meta is None or not case.meta.generation.mode.is_positive:
        # Invalid input must be refused as it is; but an object or list in the query is sent form-exploded
        # (``groups={"": 0}`` goes out as ``?=0``), so the invalid parameter never reaches the server. Send it as
        # the text a client would have put there.
        for name, value in list((case.query or {}).items()):
            if isinstance(value, dict | list):
                case.query[name] = json.dumps(value)
        return
    _point_at_real_rows(case, real)
    if case.method == "POST" and case.path.startswith("/v1/engines") and isinstance(case.body, dict):
        # A schema-valid engine URL may name any host: the fleet would probe it. Keep its kind, aim it at a closed
        # loopback port (the engine is then down, which the fleet must survive).
        kind = str(case.body.get("url", "")).partition("+")[0]
        case.body["url"] = f"{kind}+http://127.0.0.1:9" if kind in ("vllm", "sglang") else "http://127.0.0.1:9"
    if (case.method, case.path) == ("POST", "/v1/batches") and isinstance(case.body, dict):
        _confine(case.body.get("defaults"))
        for task in case.body.get("tasks") or []:
            _confine(task)
    try:
        wait = float((case.query or {}).get("wait", 0))  # the coverage phase sends query values as strings
    except (TypeError, ValueError):
        return
    if wait > MAX_WAIT_S:
        case.query["wait"] = MAX_WAIT_S  # a long-poll would only make the run slow


@schema.parametrize()
@settings(deadline=None, database=None)
def test_api_matches_its_description(case: Any, stack: RunningStack, real: dict[str, str]) -> None:
    _adapt(case, real)
    excluded = DEPLOYMENT_DEPENDENT.get((case.method, case.path), [])
    case.call_and_validate(headers=stack.api_headers, excluded_checks=excluded, timeout=30)


def test_fuzzed_batches_end_when_cancelled(stack: RunningStack, real: dict[str, str]) -> None:
    """Whatever the fuzzing submitted ends: cancelled, or finished on its own within its short budget."""
    rows = stack.sql("SELECT id FROM batches WHERE id != :real", real=real["batch_id"])
    for (batch_id,) in rows:
        response = httpx.post(
            f"{stack.api_url}/v1/batches/{batch_id}/cancel", headers=stack.api_headers, timeout=HANG_GUARD_S
        )
        assert response.status_code == 202, response.text
    httpx.post(
        f"{stack.api_url}/v1/engine/resume", headers=stack.api_headers, json={}, timeout=HANG_GUARD_S
    ).raise_for_status()
    open_sessions = "SELECT count(*) FROM sessions WHERE state NOT IN ('completed', 'failed', 'timed_out', 'cancelled')"
    wait_until(lambda: stack.sql(open_sessions)[0][0] == 0, timeout_s=180, message="every fuzzed session to end")
    assert rows, "the fuzzing never got a batch accepted: the request schema or the confinement is off"


def test_description_is_open_and_names_every_path(stack: RunningStack) -> None:
    response = httpx.get(f"{stack.api_url}/openapi.json", timeout=HANG_GUARD_S)  # no token
    assert response.status_code == 200 and response.headers["access-control-allow-origin"] == "*"
    document = response.json()
    assert document["openapi"] == "3.1.0"
    assert {"/v1/batches", "/v1/sessions/{session_id}/events", "/v1/trajectories", "/healthz"} <= set(document["paths"])


def test_the_commands_in_docs_api_md_run(stack: RunningStack, real: dict[str, str]) -> None:
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "docs" / "api.md").read_text(), re.DOTALL)
    env = {
        **os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "POLAR_API_URL": stack.api_url, "POLAR_API_TOKEN": stack.api_token,
        "POLAR_API_READ_TOKEN": stack.env["POLAR_API_READ_TOKEN"],
    }  # fmt: skip
    outputs = []
    for block in blocks:  # from the checkout, as the document says (schemathesis reads its schemathesis.toml)
        ran = subprocess.run(["bash", "-euo", "pipefail", "-c", block], env=env, capture_output=True, text=True,
                             timeout=120, cwd=ROOT)  # fmt: skip
        # A string, not a tuple: pytest shows it whole (schemathesis's report is what says what failed).
        assert ran.returncode == 0, f"{block}\n{ran.stdout[-6000:]}\n{ran.stderr[-3000:]}"
        outputs.append(ran.stdout)
    described, not_found, engines, fuzzed = outputs
    assert described.startswith("3.1.0\n") and "/v1/sessions/{session_id}/events\n" in described
    assert json.loads(not_found)["error"] == {"message": "session 'not-a-session' not found (ids are UUIDs)",
                                              "status": 404}  # fmt: skip
    assert any(engine["healthy"] and engine["kind"] == "vllm" for engine in json.loads(engines)["engines"])
    assert "GET /v1/batches/{batch_id}" in fuzzed and "POST" not in fuzzed
