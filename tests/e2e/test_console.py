"""The web console in a real headless Chromium, on one real batch through the whole stack: a harness that
rewrites its history (three chat calls merged by prefix merging, one ``answer_rewritten`` break) and one that fails
printing HTML. Signs in with the read-only token, checks the batch, session and trajectory pages against the
database and the engine, and fails on any console error. Screenshots land in the test's tmp dir and, with
POLAR_ARTIFACTS set, there too."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.browser import Browser, Page
from tests.e2e.agents.rewriting import REWRITTEN
from tests.processes import HANG_GUARD_S
from tests.shared_stack import READ_TOKEN, routed
from tests.stacks import RunningStack
from tests.stage_calls import with_a_model_call

REPO = str(Path(__file__).resolve().parents[2])
# The shared stack's engine answers this module's tasks from its "console" script (tests/shared_stack.py): by how
# many assistant turns the conversation holds, the last answer carrying HTML.
FAILING_OUTPUT = "<b>oops</b> <img src=x>"


@pytest.fixture(scope="module")
def stack(shared_stack: RunningStack) -> RunningStack:
    return shared_stack


@pytest.fixture(scope="module")
def batch(stack: RunningStack) -> dict[str, Any]:
    body = {
        "name": "console <e2e>",
        "tasks": [
            {
                "task_id": "rewrite",
                "instruction": routed("console", "Tell me something."),
                "num_samples": 2,
                "reconstruction": "prefix_merging",
                "harness": {"name": "python", "command": "tests.e2e.agents.rewriting:run", "env": {"PYTHONPATH": REPO}},
            },
            {
                "task_id": "fails",
                "instruction": routed("console", "Fail."),
                "harness": {"name": "command", "command": with_a_model_call(f"echo '{FAILING_OUTPUT}'; exit 3")},
            },
        ],
    }
    batch_id = stack.client.submit(body)["batch_id"]
    final = stack.wait(batch_id)
    sessions = list(stack.client.sessions(batch_id))
    assert final["counts"] == {"completed": 2, "failed": 1}, [s["error"] for s in sessions]
    return {"batch_id": batch_id, "sessions": sessions}


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    directory = tmp_path_factory.mktemp("console-screenshots")
    yield directory
    if os.environ.get("POLAR_ARTIFACTS"):
        target = Path(os.environ["POLAR_ARTIFACTS"]) / "console"
        shutil.copytree(directory, target, dirs_exist_ok=True)


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Page]:
    with Browser.launch(tmp_path_factory.mktemp("chromium")) as browser:
        yield browser.new_page()


def text(page: Page, selector: str) -> str:
    return str(page.evaluate(f"document.querySelector({json.dumps(selector)}).textContent.trim()"))


def texts(page: Page, selector: str) -> list[str]:
    return list(page.evaluate(f"[...document.querySelectorAll({json.dumps(selector)})].map(e => e.textContent)"))


def detokenize(stack: RunningStack, ids: list[int]) -> str:
    return str(
        httpx.post(f"{stack.engine_url}/detokenize", json={"tokens": ids}, timeout=HANG_GUARD_S).json()["prompt"]
    )


def sign_in(page: Page, token: str) -> None:
    page.evaluate(f"document.querySelector('#token').value = {json.dumps(token)}")
    page.click_and_wait("#sign-in")


@pytest.fixture
def signed_in(stack: RunningStack, page: Page) -> Page:
    """The module's page, signed in with the read token: each test stands alone, in any order or by itself."""
    page.goto(f"{stack.api_url}/ui/")
    if page.evaluate("location.pathname") == "/ui/login":
        sign_in(page, READ_TOKEN)
    assert page.evaluate("location.pathname") == "/ui/"
    return page


def test_signing_in_with_the_read_token(stack: RunningStack, batch: dict[str, Any], page: Page, shots: Path) -> None:
    page.goto(f"{stack.api_url}/ui/logout")  # signed out, whatever ran before
    batch_url = f"{stack.api_url}/ui/batches/{batch['batch_id']}"
    page.goto(batch_url)
    assert page.evaluate("location.pathname") == "/ui/login"  # no cookie yet: sent to the form
    page.screenshot(shots / "login.png")
    assert page.errors == []
    sign_in(page, "not-a-token-" + "x" * 30)
    assert "not one of this API's tokens" in text(page, ".login .error")
    # The refusal is a 401, which the browser reports itself; nothing else went wrong.
    assert [error for error in page.errors if "status of 401" not in error] == [] and len(page.errors) == 1
    page.forget_errors()
    sign_in(page, READ_TOKEN)
    assert page.evaluate("location.href") == batch_url  # back where the browser was going
    assert text(page, "header .who").startswith("read:")
    assert page.errors == []


def test_batch_page_shows_the_batch(stack: RunningStack, batch: dict[str, Any], signed_in: Page, shots: Path) -> None:
    page = signed_in
    page.goto(f"{stack.api_url}/ui/batches/{batch['batch_id']}")
    assert text(page, "#num-sessions") == "3"
    assert texts(page, "#state-counts span") == ["completed 2", "failed 1"]
    assert page.evaluate("document.querySelectorAll('#progress rect').length") == 2
    cell = "#tasks tr[data-task-id='{}'] td[data-state='{}']"
    assert text(page, cell.format("rewrite", "completed")) == "2"
    assert text(page, cell.format("fails", "failed")) == "1"
    assert page.evaluate("document.querySelectorAll('#tasks svg.histogram').length") == 2
    assert text(page, "#acceptance").startswith("67%")
    rows = page.evaluate(
        "[...document.querySelectorAll('#sessions tr[data-session-id]')].map(r => r.dataset.sessionId)"
    )
    assert sorted(rows) == sorted(s["session_id"] for s in batch["sessions"])
    # The batch's name is text, not markup.
    assert "console <e2e>" in page.evaluate("document.querySelector('h1').textContent")
    assert page.evaluate("document.querySelector('e2e')") is None
    page.screenshot(shots / "batch.png")
    page.goto(f"{stack.api_url}/ui/")
    assert page.evaluate(f"!!document.querySelector('tr[data-batch-id=\"{batch['batch_id']}\"]')")
    page.screenshot(shots / "batches.png")
    assert page.errors == []


def rewrite_session(batch: dict[str, Any]) -> dict[str, Any]:
    return next(s for s in batch["sessions"] if s["task_id"] == "rewrite")


def test_session_page_lists_events_and_calls(stack: RunningStack, batch: dict[str, Any], signed_in: Page,
                                            shots: Path) -> None:  # fmt: skip
    page = signed_in
    session = rewrite_session(batch)
    page.goto(f"{stack.api_url}/ui/batches/{batch['batch_id']}")
    page.click_and_wait(f"#sessions tr[data-session-id='{session['session_id']}'] a")
    events = stack.sql(
        "SELECT to_state FROM session_events WHERE session_id = :id ORDER BY id", id=session["session_id"]
    )
    shown = page.evaluate("[...document.querySelectorAll('#timeline tr.event')].map(r => r.dataset.toState)")
    assert shown == [row.to_state for row in events]
    assert shown[0] == "pending" and shown[-1] == "completed"
    assert page.evaluate("[...document.querySelectorAll('#calls details.call')].map(d => d.dataset.seq)") == [
        "1", "2", "3",
    ]  # fmt: skip
    assert page.evaluate("document.querySelectorAll('#trajectories tr[data-trajectory-id]').length") == 2
    # The segments as a tree: the rewritten answer's trajectory a rewrite under the root.
    nodes = "[...document.querySelectorAll('#segments li')]"
    tree = page.evaluate(
        f"{nodes}.map(li => [li.dataset.segment, li.dataset.edge, li.dataset.parent, "
        "li.parentElement.closest('li')?.dataset.segment ?? null])"
    )
    assert tree == [["0", "root", "", None], ["1", "rewrite", "0", "0"]]
    page.evaluate("document.querySelector('button[data-expand]').click()")  # the script opens every call
    assert page.evaluate("[...document.querySelectorAll('details.call')].every(d => d.open)")
    assert REWRITTEN in text(page, "details.call[data-seq='3']")
    page.screenshot(shots / "session.png")

    failed = next(s for s in batch["sessions"] if s["task_id"] == "fails")
    page.goto(f"{stack.api_url}/ui/sessions/{failed['session_id']}")
    assert FAILING_OUTPUT in text(page, "#error")  # shown as text ...
    assert page.evaluate("document.querySelectorAll('#error *').length") == 0  # ... never as markup
    assert "exit_code" in text(page, "#evaluation")
    page.screenshot(shots / "session-failed.png")
    assert page.errors == []


def test_trajectory_viewer_marks_sampled_tokens_and_the_break(stack: RunningStack, batch: dict[str, Any],
                                                              signed_in: Page, shots: Path) -> None:  # fmt: skip
    page = signed_in
    session = rewrite_session(batch)
    calls = {call["seq"]: call for call in stack.client.calls(session["session_id"])}
    trajectories = stack.client.trajectories(session["session_id"])
    (merge_break,) = stack.sql(
        "SELECT reason, position, seq FROM merge_breaks WHERE session_id = :id", id=session["session_id"]
    )
    assert (merge_break.reason, merge_break.seq) == ("answer_rewritten", 3)
    expected_seqs = [["1", "2"], ["3"]]
    for index, trajectory in enumerate(trajectories):
        page.goto(f"{stack.api_url}/ui/trajectories/{trajectory['trajectory_id']}")
        seqs = page.evaluate("[...document.querySelectorAll('#tokens section.call')].map(s => s.dataset.seq)")
        assert seqs == expected_seqs[index]
        for seq in seqs:
            completion = calls[int(seq)]["completion_token_ids"]
            sampled = texts(page, f"section.call[data-seq='{seq}'] .run.sampled")
            assert "".join(sampled) == detokenize(stack, completion)  # the sampled tokens, decoded, marked
            count = f"document.querySelectorAll(\"section.call[data-seq='{seq}'] .run.sampled .t\").length"
            assert page.evaluate(count) == len(completion)
        shown = page.evaluate("document.querySelectorAll('#tokens .t').length")
        assert shown == len(trajectory["token_ids"])
        # Both sides of the break are marked at its position, with its reason.
        marks = page.evaluate(
            "[...document.querySelectorAll('#tokens .break')].map(b => [b.dataset.reason, +b.dataset.position])"
        )
        assert marks == [["answer_rewritten", merge_break.position]]
        title = page.evaluate("document.querySelector('.run.sampled .t').title")
        assert "logprob" in title
        page.screenshot(shots / f"trajectory-{index}.png")
    # The model's "<script>" is text in the page, and nothing ran it.
    assert "<script>console.error('injected')</script>" in "".join(texts(page, ".run.sampled"))
    assert page.evaluate("document.querySelectorAll('#tokens script, #tokens b').length") == 0
    assert page.errors == []


def test_logging_out(stack: RunningStack, page: Page) -> None:
    page.goto(f"{stack.api_url}/ui/logout")
    assert page.evaluate("location.pathname") == "/ui/login"
    page.goto(f"{stack.api_url}/ui/")
    assert page.evaluate("location.pathname") == "/ui/login"
    assert page.errors == []
