"""Every harness preset, unmodified, through the whole pipeline against real vLLM (the run's shared server:
``polar engine --backend vllm --policy route``, its fallback route ``tool_user``): the six coding-agent CLIs,
mini-swe-agent, hermes and openclaw, each asked to "Create hello.txt containing polar-ok" in one batch.

vLLM renders each prompt with the model's chat template, parses the tool calls (``hermes``) and reasoning
(``qwen3``), samples the tokens (held to the policy's answer by ``polar.refengine.vllm.forcing``) and reports the
model's raw logprobs. Each session must complete with the file holding exactly ``polar-ok`` after at least two
model calls, and every captured call must be token-exact: its prompt ids are vLLM's ``/tokenize`` of the stored
request, its completion ids what vLLM sampled (logged from inside vLLM).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from polar.harnesses.install import install
from tests.e2e.file_task import SESSION_BUDGET_S, batch_timeout_s, wait_finished
from tests.real_vllm import SharedVllm
from tests.stacks import RunningStack, engine_tokenize, running_stack

pytestmark = [
    pytest.mark.long(seconds=125),
    pytest.mark.timeout(3000),
]  # three waves of sessions that may each use their budget

REPO = str(Path(__file__).resolve().parents[2])
# The six CLIs, mini_swe_agent, hermes, openclaw; the presets of issue 31 run on the reference engine
# (tests/e2e/test_harness_new.py).
HARNESSES = (
    "claude_code",
    "codex",
    "gemini_cli",
    "qwen_code",
    "opencode",
    "pi",
    "mini_swe_agent",
    "hermes",
    "openclaw",
)
CONTENT = "polar-ok"
RUN_CONCURRENCY = 3


@pytest.fixture(scope="module")
def results(
    real_vllm: SharedVllm, module_database_url: str, module_broker_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    install(HARNESSES)
    tmp = tmp_path_factory.mktemp("real-vllm-harnesses")
    env = {"PYTHONPATH": REPO, "POLAR_PLUGIN_MODULES": "tests.e2e"}
    with running_stack(
        module_database_url, module_broker_url, tmp, run_concurrency=RUN_CONCURRENCY, env=env, engine_url=real_vllm.url
    ) as stack:
        tasks = [
            {
                "task_id": harness,
                "instruction": f"Create hello.txt containing {CONTENT}",
                "timeout_seconds": SESSION_BUDGET_S,
                "harness": {"name": harness},
                "evaluator": {"name": "tests.e2e.file_check:FileContent", "config": {"path": "hello.txt",
                                                                                    "content": CONTENT}},
            }
            for harness in HARNESSES
        ]  # fmt: skip
        submitted = stack.client.submit({"name": "real-vllm-harnesses", "tasks": tasks})
        wait_finished(stack, submitted["batch_id"], batch_timeout_s(len(tasks), RUN_CONCURRENCY))
        found: dict[str, Any] = {"stack": stack}
        for session in stack.client.sessions(submitted["batch_id"]):
            found[session["task_id"]] = session
        yield found


@pytest.mark.parametrize("harness", HARNESSES)
def test_the_harness_creates_the_file_on_real_vllm_token_exactly(
    harness: str, results: dict[str, Any], real_vllm: SharedVllm
) -> None:
    session = results[harness]
    details = session.get("evaluation") or {}
    diagnosis = f"{harness}: error={session['error']!r}\nlog:\n{details.get('harness_log', '')}"
    assert (session["state"], session["exit_code"]) == ("completed", 0), diagnosis
    assert (details.get("found") or "").rstrip("\n") == CONTENT, diagnosis
    assert session["reward"] == 1.0

    stack: RunningStack = results["stack"]
    calls = [c for c in stack.client.calls(session["session_id"]) if c["status_code"] == 200]
    assert len(calls) >= 2, diagnosis  # the action, then the answer (or the submit command)
    for call in calls:
        assert call["engine_kind"] == "vllm"
        assert call["prompt_token_ids"] == engine_tokenize(real_vllm.url, call["normalized_request"])
        sampled = real_vllm.sampled_for(call["prompt_token_ids"])
        assert call["completion_token_ids"] == sampled["token_ids"][: len(call["completion_token_ids"])]
        if call["finish_reason"] != "stop" or not isinstance(call["response"]["choices"][0].get("stop_reason"), str):
            assert call["completion_token_ids"] == sampled["token_ids"]  # only a stop string cuts the sample
        assert len(call["logprobs"]) == len(call["completion_token_ids"])
    # The policy's action went out as a tool call vLLM's hermes parser read (or, for mini-swe-agent's text mode, a
    # fenced shell block in the content); the trajectory is rebuilt from those calls.
    if harness != "mini_swe_agent":
        assert any(call["finish_reason"] == "tool_calls" for call in calls), diagnosis
    trajectories = stack.client.trajectories(session["session_id"])
    assert trajectories and all(len(t["loss_mask"]) == len(t["token_ids"]) for t in trajectories)
