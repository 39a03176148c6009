"""The harness presets added for issue 31, unmodified, through the whole pipeline in the local runtime and in bubblewrap
(whose network holds nothing but the relay to the proxy): API, stage workers, proxy, and the reference engine
answering with its ``tool_user`` policy (the test process's shared stack). Kilo Code, Cline and Factory's Droid come
from npm; Mistral Vibe and kimi-cli from PyPI, in Python 3.12 and 3.13 virtualenvs of their own; aider from PyPI, in
its whole-file edit format (a file listing in the reply, no tool calls). None of them uses an account: each is
pointed at the proxy alone.

All twelve sessions run in one batch. Each must complete with reward 1.0 (the ``FileContent`` evaluator found the
file holding exactly what was asked), and every captured call must be what the engine served, token for token.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e.file_task import check_file_task, file_task_results
from tests.stacks import RunningStack

pytestmark = [pytest.mark.long(seconds=61), pytest.mark.timeout(2700)]  # installs five CLIs, then three waves

HARNESSES = ("kilocode", "cline", "droid", "mistral_vibe", "kimi_cli", "aider")
RUNTIMES = ("local", "bwrap")


@pytest.fixture(scope="module")
def results(shared_stack: RunningStack) -> dict[str, Any]:
    return file_task_results(shared_stack, "harness-new", HARNESSES, RUNTIMES)


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("harness", HARNESSES)
def test_the_harness_creates_the_file_token_exactly(harness: str, runtime: str, results: dict[str, Any]) -> None:
    # the action, then the answer; aider's one request is its whole run (it writes the listed file and exits)
    check_file_task(results, harness, runtime, min_calls=1 if harness == "aider" else 2)
