"""The six coding-agent CLIs, unmodified, through the whole pipeline: API, Celery stage workers, local runtime,
proxy, and the reference engine running the ``tool_user`` policy.

Each CLI is installed once (npm, into the harness cache; skipped when already there) and asked to
"Create hello.txt containing HELLO-<cli>". All six sessions run in ONE batch on one stack. The file is checked
by the ``tests.e2e.file_check:FileContent`` evaluator, which runs before teardown removes the session
directory: reward 1.0 means the CLI executed the policy's tool call and the file holds exactly the content.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from polar.harnesses.install import PACKAGES, install
from tests.support import RunningStack, running_stack

pytestmark = pytest.mark.long(seconds=38)  # dealt out first, longest first (tests/conftest.py)

REPO = str(Path(__file__).resolve().parents[2])
CLIS = ("claude_code", "codex", "gemini_cli", "qwen_code", "opencode", "pi")
# Known failures, each with the exact error seen; strict, so a CLI that starts working is noticed.
XFAIL: dict[str, str] = {}
# Per-CLI harness settings for the test session (none needed: every CLI runs as installed).
SETTINGS: dict[str, dict[str, Any]] = {}


def content_for(cli: str) -> str:
    return f"HELLO-{cli.replace('_', '-')}-123"


@pytest.fixture(scope="session")
def cli_versions() -> dict[str, str]:
    """All six CLIs installed in the harness cache (one npm call; nothing when cached)."""
    return install(PACKAGES)


@pytest.fixture(scope="module")
def batch_results(
    cli_versions: dict[str, str],
    module_database_url: str,
    module_broker_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, Any]]:
    """One batch with one session per CLI; per CLI: the session, its calls and trajectories, and the stack."""
    tmp = tmp_path_factory.mktemp("harness-clis")
    with running_stack(
        module_database_url, module_broker_url, tmp, policy="tool_user", policy_config="{}",
        run_concurrency=len(CLIS), env={"PYTHONPATH": REPO, "POLAR_PLUGIN_MODULES": "tests.e2e"},
    ) as stack:  # fmt: skip
        tasks = [
            {
                "task_id": cli,
                "instruction": f"Create hello.txt containing {content_for(cli)}",
                "timeout_seconds": 240,
                "harness": {"name": cli, "settings": SETTINGS.get(cli, {})},
                "evaluator": {
                    "name": "tests.e2e.file_check:FileContent",
                    "config": {"path": "hello.txt", "content": content_for(cli)},
                },
            }
            for cli in CLIS
        ]
        submitted = stack.client.submit({"name": "harness-clis", "tasks": tasks})
        stack.wait(submitted["batch_id"], timeout_s=400)
        results: dict[str, Any] = {"stack": stack}
        for session in stack.client.sessions(submitted["batch_id"]):
            sid = session["session_id"]
            results[session["task_id"]] = {
                "session": session,
                "calls": stack.client.calls(sid),
                "trajectories": stack.client.trajectories(sid),
            }
        yield results


def _params() -> list[Any]:
    return [
        pytest.param(cli, id=cli, marks=[pytest.mark.xfail(strict=True, reason=XFAIL[cli])] if cli in XFAIL else [])
        for cli in CLIS
    ]


@pytest.mark.parametrize("cli", _params())
def test_cli_creates_the_file_through_the_pipeline(cli: str, batch_results: dict[str, Any]) -> None:
    result = batch_results[cli]
    session, calls = result["session"], result["calls"]
    details = session.get("evaluation") or {}
    diagnosis = f"{cli}: error={session['error']!r}\nlog:\n{details.get('harness_log', '')}"
    assert session["exit_code"] == 0, diagnosis
    assert session["state"] == "completed", diagnosis
    # The file exists in the session's work folder with exactly the content asked for.
    assert details.get("found") is not None, diagnosis
    assert details["found"].rstrip("\n") == content_for(cli)
    assert session["reward"] == 1.0

    # Captured in Postgres with token ids; one call carries the policy's tool call, a later one its answer.
    stack: RunningStack = batch_results["stack"]
    rows = stack.sql(
        "SELECT cardinality(prompt_token_ids), cardinality(completion_token_ids), finish_reason "
        "FROM model_calls WHERE session_id = :sid ORDER BY seq",
        sid=session["session_id"],
    )
    assert len(rows) == len(calls) >= 2
    assert all(prompt > 0 and completion > 0 for prompt, completion, _ in rows)
    assert any(finish == "tool_calls" for _, _, finish in rows), rows
    for call in calls:
        assert call["status_code"] == 200
        assert len(call["logprobs"]) == len(call["completion_token_ids"])

    # The trajectory is rebuilt from those calls.
    trajectories = result["trajectories"]
    assert trajectories
    for trajectory in trajectories:
        assert trajectory["token_ids"] and len(trajectory["loss_mask"]) == len(trajectory["token_ids"])
