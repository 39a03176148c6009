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
from typing import Any

import pytest

from tests.e2e.file_task import check_file_task, file_task_results

pytestmark = [pytest.mark.long(seconds=70), pytest.mark.timeout(1500)]  # installs three CLIs, then one wave

HARNESSES = ("mini_swe_agent", "hermes", "openclaw")
RUNTIMES = ("bwrap",)


@pytest.fixture(scope="module")
def results(
    module_database_url: str, module_broker_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("harness-more")
    with file_task_results(
        module_database_url, module_broker_url, tmp, HARNESSES, RUNTIMES, run_concurrency=3
    ) as found:
        yield found


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("harness", HARNESSES)
def test_the_harness_creates_the_file_token_exactly(harness: str, runtime: str, results: dict[str, Any]) -> None:
    # the action, then the answer (or the submit command)
    check_file_task(results, harness, runtime, min_calls=2)
