"""The three further harness presets (mini-swe-agent and hermes from PyPI, each in its own virtualenv; openclaw
from npm on the Node.js 24 the cache holds for it), unmodified, through the whole pipeline in bubblewrap: API, stage
workers, proxy, and the reference engine with the ``tool_user`` policy (a write or shell tool for hermes and
openclaw, a fenced shell block for mini-swe-agent's text-based mode). In the local runtime they run against real
vLLM with the six CLIs (``tests/e2e/test_real_vllm_harnesses.py``).

All three sessions run in one batch. Each must complete with reward 1.0 (the ``FileContent`` evaluator found the
file holding exactly what was asked), and every captured call must be what the engine served, token for token.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from polar.harnesses.install import install
from tests.support import RunningStack, running_stack

pytestmark = [pytest.mark.long(seconds=70), pytest.mark.timeout(900)]  # installs three CLIs first

REPO = str(Path(__file__).resolve().parents[2])
HARNESSES = ("mini_swe_agent", "hermes", "openclaw")
RUNTIMES = ("bwrap",)


def content_for(harness: str, runtime: str) -> str:
    return f"HELLO-{harness.replace('_', '-')}-{runtime}-7"


@pytest.fixture(scope="module")
def results(
    module_database_url: str, module_broker_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    install(HARNESSES)
    tmp = tmp_path_factory.mktemp("harness-more")
    with running_stack(
        module_database_url, module_broker_url, tmp, policy="tool_user", policy_config="{}", run_concurrency=3,
        env={"PYTHONPATH": REPO, "POLAR_PLUGIN_MODULES": "tests.e2e"},
    ) as stack:  # fmt: skip
        tasks = [
            {
                "task_id": f"{harness}-{runtime}",
                "instruction": f"Create hello.txt containing {content_for(harness, runtime)}",
                "timeout_seconds": 240,
                "runtime": {"backend": runtime},
                "harness": {"name": harness},
                "evaluator": {
                    "name": "tests.e2e.file_check:FileContent",
                    "config": {"path": "hello.txt", "content": content_for(harness, runtime)},
                },
            }
            for harness in HARNESSES
            for runtime in RUNTIMES
        ]
        submitted = stack.client.submit({"name": "harness-more", "tasks": tasks})
        stack.wait(submitted["batch_id"], timeout_s=500)
        found: dict[str, Any] = {"stack": stack, "engine": stack.engine_entries()}
        for session in stack.client.sessions(submitted["batch_id"]):
            found[session["task_id"]] = session
        yield found


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("harness", HARNESSES)
def test_the_harness_creates_the_file_token_exactly(harness: str, runtime: str, results: dict[str, Any]) -> None:
    session = results[f"{harness}-{runtime}"]
    details = session.get("evaluation") or {}
    diagnosis = f"{harness}/{runtime}: error={session['error']!r}\nlog:\n{details.get('harness_log', '')}"
    assert (session["state"], session["exit_code"]) == ("completed", 0), diagnosis
    assert details.get("found", "").rstrip("\n") == content_for(harness, runtime), diagnosis
    assert session["reward"] == 1.0

    stack: RunningStack = results["stack"]
    calls = stack.client.calls(session["session_id"])
    assert len(calls) >= 2, diagnosis  # the action, then the answer (or the submit command)
    for call in calls:
        served = results["engine"][call["response"]["id"]]
        assert call["status_code"] == 200
        assert call["prompt_token_ids"] == served["prompt_token_ids"]
        assert call["completion_token_ids"] == served["token_ids"]
        assert len(call["logprobs"]) == len(call["completion_token_ids"])
    assert stack.client.trajectories(session["session_id"])
