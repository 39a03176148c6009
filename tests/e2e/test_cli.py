"""The ``polar`` commands that talk to the rollout API, against one real stack: ``submit FILE --wait`` (a batch
file, or JSONL rows through a template), ``status`` (once, ``--watch``, ``--json``), ``logs`` and ``open``."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from polar.datasets import ARITHMETIC_ROWS, ARITHMETIC_TEMPLATE
from polar.local import cli_views
from polar.local.cli import main
from tests.processes import HANG_GUARD_S
from tests.stacks import RunningStack
from tests.stage_calls import command_task

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def stack(shared_stack: RunningStack) -> RunningStack:
    return shared_stack


@pytest.fixture
def runner(stack: RunningStack) -> CliRunner:
    return CliRunner(env={"POLAR_API_TOKEN": stack.api_token, "POLAR_API_URL": stack.api_url})


def test_submit_wait_and_status(stack: RunningStack, runner: CliRunner, tmp_path: Path) -> None:
    batch_file = tmp_path / "batch.yaml"
    batch_file.write_text(json.dumps({"tasks": [command_task("cli", "echo {instruction}", samples=2)]}))
    submitted = runner.invoke(main, ["submit", str(batch_file), "--wait", "--api", stack.api_url])
    assert submitted.exit_code == 0, submitted.output
    first, last = submitted.output.strip().splitlines()[0], submitted.output.strip().splitlines()[-1]
    batch_id = json.loads(first)["batch_id"]
    assert json.loads(last) == {"completed": 2}
    status = runner.invoke(main, ["status", batch_id, "--json", "--api", stack.api_url])
    assert status.exit_code == 0 and json.loads(status.output)["status"] == "finished"
    missing = runner.invoke(main, ["status", "00000000-0000-0000-0000-000000000000", "--api", stack.api_url])
    assert missing.exit_code != 0 and "404" in missing.output
    anonymous = runner.invoke(main, ["status", batch_id, "--api", stack.api_url], env={"POLAR_API_TOKEN": None})
    assert anonymous.exit_code != 0 and "401" in anonymous.output


def test_submit_rows_through_a_template(stack: RunningStack, tmp_path: Path) -> None:
    defaults = json.dumps({"timeout_seconds": 90, "metadata": {"source": "cli-test"}})
    args = ["submit", str(ARITHMETIC_ROWS), "--template", str(ARITHMETIC_TEMPLATE), "--limit", "3", "--samples", "2"]
    runner = CliRunner()
    bad = runner.invoke(main, [*args, "--defaults", '{"reconstruction": "bogus"}', "--api", "http://127.0.0.1:9"])
    assert bad.exit_code == 1 and f"{ARITHMETIC_ROWS}:1: reconstruction: " in bad.output  # refused before sending
    access = ["--api", stack.api_url, "--token", stack.api_token]
    submitted = runner.invoke(main, [*args, "--defaults", defaults, "--name", "rows", "--wait", *access])
    assert submitted.exit_code == 0, submitted.output
    lines = submitted.output.strip().splitlines()
    batch_id = json.loads(lines[0])["batch_id"]
    assert json.loads(lines[0])["num_sessions"] == 6 and json.loads(lines[-1]) == {"completed": 6}
    tasks = stack.sql("SELECT task_id, spec FROM tasks WHERE batch_id = :b ORDER BY position", b=batch_id)
    assert [task_id for task_id, _ in tasks] == ["arith-00", "arith-01", "arith-02"]
    spec = tasks[0][1]
    assert spec["timeout_seconds"] == 120  # the template's own value beats the defaults
    assert spec["metadata"] == {"source": "cli-test", "expression": "17 * 23", "expected": "391"}
    rewards = stack.sql("SELECT reward FROM sessions WHERE batch_id = :b", b=batch_id)
    assert [reward for (reward,) in rewards] == [1.0] * 6  # accuracy 1.0: every answer right
    [(name, submitted_by)] = stack.sql("SELECT name, submitted_by FROM batches WHERE id = :b", b=batch_id)
    assert name == "rows" and submitted_by.startswith("admin:") and stack.api_token not in submitted_by


def _table_counts(frame: str) -> dict[str, int]:
    """The ``state  sessions`` rows of one ``polar status`` table."""
    return {m[1]: int(m[2]) for m in re.finditer(r"^\S*\s+(\w+)\s+(\d+)$", frame, re.MULTILINE)}


def test_status_watch_follows_a_batch_to_the_end(stack: RunningStack, runner: CliRunner) -> None:
    tasks = [command_task("slow", "sleep 1.5", samples=2), command_task("broken", "exit 3")]
    batch_id = stack.client.submit({"name": "watched", "tasks": tasks})["batch_id"]
    watched = runner.invoke(main, ["status", batch_id, "--watch", "--interval", "0.2"])
    assert watched.exit_code == 0, watched.output
    frames = watched.output.split(f"batch {batch_id}  watched: ")[1:]
    assert len(frames) >= 2, watched.output  # a pipe gets a frame per change: at least a running one and the end
    assert frames[0].startswith(("pending", "running")) and frames[-1].startswith("finished")
    assert "[" + "#" * cli_views.BAR_WIDTH + "] 3/3 finished (100%)" in frames[-1]
    assert _table_counts(frames[-1]) == {
        "pending": 0, "init": 0, "ready": 0, "running": 0, "postrun": 0,
        "completed": 2, "failed": 1, "timed_out": 0, "cancelled": 0,
    }  # fmt: skip
    assert "running" in {state for frame in frames[:-1] for state, n in _table_counts(frame).items() if n}
    once = runner.invoke(main, ["status", batch_id])
    assert once.exit_code == 0 and once.output.count(f"batch {batch_id}") == 1
    assert _table_counts(once.output) == _table_counts(frames[-1])
    as_json = runner.invoke(main, ["status", batch_id, "--watch", "--json"])
    assert as_json.exit_code == 0 and json.loads(as_json.output)["counts"] == {"completed": 2, "failed": 1}


def test_ctrl_c_stops_watching_not_the_batch(
    stack: RunningStack, runner: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    batch_id = stack.client.submit({"tasks": [command_task("long", "sleep 30")]})["batch_id"]

    def interrupt(_seconds: float) -> None:
        raise KeyboardInterrupt

    # The view's own ``time`` only: patching ``time.sleep`` itself would interrupt every thread of this process.
    monkeypatch.setattr(cli_views, "time", SimpleNamespace(sleep=interrupt))
    try:
        watched = runner.invoke(main, ["status", batch_id, "--watch"])
        assert watched.exit_code == 130 and f"batch {batch_id}" in watched.output, (watched.output, watched.exc_info)
        assert stack.client.batch(batch_id)["status"] != "finished"  # watching stopped; the batch did not
    finally:
        stack.client.cancel(batch_id)


def test_logs_show_events_durations_and_the_error(stack: RunningStack, runner: CliRunner) -> None:
    tasks = [command_task("fine", "echo fine"), command_task("oops", "echo something broke; exit 3")]
    batch_id = stack.client.submit({"tasks": tasks})["batch_id"]
    stack.wait(batch_id)
    sessions = {s["task_id"]: s for s in stack.client.sessions(batch_id)}
    fine = runner.invoke(main, ["logs", sessions["fine"]["session_id"]])
    assert fine.exit_code == 0, fine.output
    lines = fine.output.splitlines()
    assert lines[0] == f"session {sessions['fine']['session_id']}"
    events = [line.split()[2:4] for line in lines if re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} ", line)]
    assert [state for state, _ in events] == ["pending", "init", "ready", "running", "postrun", "completed"]
    assert all(re.fullmatch(r"\d+\.\d{3}s", took) for _, took in events[:-1]) and events[-1][1] == "-"
    assert "time in each state: pending " in fine.output and "error / output tail" not in fine.output
    oops = runner.invoke(main, ["logs", sessions["oops"]["session_id"]])
    assert oops.exit_code == 0 and "  failed" in oops.output and "exit code 3" in oops.output
    assert oops.output.split("error / output tail:\n")[1].startswith("harness exited with code 3: something broke")
    as_json = json.loads(runner.invoke(main, ["logs", sessions["oops"]["session_id"], "--json"]).output)
    assert as_json["session"]["state"] == "failed" and as_json["events"]["items"][-1]["to_state"] == "failed"
    missing = runner.invoke(main, ["logs", "00000000-0000-0000-0000-000000000000"])
    assert missing.exit_code == 1 and "404" in missing.output


def test_open_prints_the_console_page(stack: RunningStack, runner: CliRunner, monkeypatch: pytest.MonkeyPatch) -> None:
    batch_id = stack.client.submit({"name": "opened", "tasks": [command_task("o", "true")]})["batch_id"]
    printed = runner.invoke(main, ["open", batch_id])
    url = f"{stack.api_url}/ui/batches/{batch_id}"
    assert printed.exit_code == 0 and printed.output == f"{url}\n"
    page = httpx.get(url, headers=stack.api_headers, timeout=HANG_GUARD_S)  # the console takes the API's token
    assert page.status_code == 200 and batch_id in page.text
    opened: list[Any] = []
    monkeypatch.setattr(cli_views.webbrowser, "open", lambda target: opened.append(target) or True)
    assert runner.invoke(main, ["open", batch_id, "--browser"]).exit_code == 0 and opened == [url]
    monkeypatch.setattr(cli_views.webbrowser, "open", lambda target: False)  # no browser on this machine
    headless = runner.invoke(main, ["open", batch_id, "--browser"])
    assert headless.exit_code == 1 and url in headless.output and "no web browser" in headless.output
