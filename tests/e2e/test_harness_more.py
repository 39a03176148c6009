"""The three further harness presets (mini-swe-agent and hermes from PyPI, each in its own virtualenv; openclaw from npm
on the Node.js 24 the cache holds for it), unmodified, through the whole pipeline in bubblewrap: API, stage workers,
proxy, and the reference engine answering with its ``tool_user`` policy (the test process's shared stack): a write or
shell tool for hermes and openclaw, a fenced shell block for mini-swe-agent's text-based mode. In the local runtime
they run against real vLLM with the six CLIs (``tests/e2e/test_real_vllm_harnesses.py``).

All three sessions run in one batch. Each must complete with reward 1.0 (the ``FileContent`` evaluator found the
file holding exactly what was asked), and every captured call must be what the engine served, token for token.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e.file_task import check_file_task, file_task_results
from tests.stacks import RunningStack

pytestmark = pytest.mark.timeout(1500)  # installs three CLIs, then one wave

HARNESSES = ("mini_swe_agent", "hermes", "openclaw")
RUNTIMES = ("bwrap",)


@pytest.fixture(scope="module")
def results(shared_stack: RunningStack) -> dict[str, Any]:
    return file_task_results(shared_stack, "harness-more", HARNESSES, RUNTIMES)


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("harness", HARNESSES)
def test_the_harness_creates_the_file_token_exactly(harness: str, runtime: str, results: dict[str, Any]) -> None:
    # the action, then the answer (or the submit command)
    check_file_task(results, harness, runtime, min_calls=2)
