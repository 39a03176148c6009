"""The harness presets added for issue 31, unmodified, through the whole pipeline in the local runtime and in
bubblewrap (whose network holds nothing but the relay to the proxy): API, stage workers, proxy, and the reference
engine with the ``tool_user`` policy. Kilo Code, Cline and Factory's Droid come from npm; Mistral Vibe and kimi-cli
from PyPI, in Python 3.12 and 3.13 virtualenvs of their own; aider from PyPI, in its whole-file edit format (a file
listing in the reply, no tool calls). None of them uses an account: each is pointed at the proxy alone.

All twelve sessions run in one batch. Each must complete with reward 1.0 (the ``FileContent`` evaluator found the
file holding exactly what was asked), and every captured call must be what the engine served, token for token.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from polar.harnesses.install import install
from tests.support import RunningStack, running_stack

pytestmark = [pytest.mark.long(seconds=90), pytest.mark.timeout(1500)]  # installs five CLIs first

REPO = str(Path(__file__).resolve().parents[2])
HARNESSES = ("kilocode", "cline", "droid", "mistral_vibe", "kimi_cli", "aider")
RUNTIMES = ("local", "bwrap")


def content_for(harness: str, runtime: str) -> str:
    return f"HELLO-{harness.replace('_', '-')}-{runtime}-7"


@pytest.fixture(scope="module")
def results(
    module_database_url: str, module_broker_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    install(HARNESSES)
    tmp = tmp_path_factory.mktemp("harness-new")
    with running_stack(
        module_database_url, module_broker_url, tmp, policy="tool_user", policy_config="{}", run_concurrency=4,
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
        submitted = stack.client.submit({"name": "harness-new", "tasks": tasks})
        stack.wait(submitted["batch_id"], timeout_s=900)
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
    # The action, then the answer; aider's one request is its whole run (it writes the listed file and exits).
    assert len(calls) >= (1 if harness == "aider" else 2), diagnosis
    for call in calls:
        served = results["engine"][call["response"]["id"]]
        assert call["status_code"] == 200
        assert call["prompt_token_ids"] == served["prompt_token_ids"]
        assert call["completion_token_ids"] == served["token_ids"]
        assert len(call["logprobs"]) == len(call["completion_token_ids"])
    assert stack.client.trajectories(session["session_id"])
