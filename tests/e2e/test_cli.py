"""``polar submit FILE --wait`` (a batch file, or JSONL rows through a template) and ``polar status`` against the
real stack."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from polar.cli import main
from polar.datasets import ARITHMETIC_ROWS, ARITHMETIC_TEMPLATE
from tests.support import command_task, running_stack


def test_submit_wait_and_status(database_url: str, broker_url: str, tmp_path: Path) -> None:
    batch_file = tmp_path / "batch.yaml"
    batch_file.write_text(json.dumps({"tasks": [command_task("cli", "echo {instruction}", samples=2)]}))
    with running_stack(database_url, broker_url, tmp_path) as stack:
        runner = CliRunner(env={"POLAR_API_TOKEN": stack.api_token})  # the CLI sends POLAR_API_TOKEN
        submitted = runner.invoke(main, ["submit", str(batch_file), "--wait", "--api", stack.api_url])
        assert submitted.exit_code == 0, submitted.output
        first, last = submitted.output.strip().splitlines()[0], submitted.output.strip().splitlines()[-1]
        batch_id = json.loads(first)["batch_id"]
        assert json.loads(last) == {"completed": 2}
        status = runner.invoke(main, ["status", batch_id, "--api", stack.api_url])
        assert status.exit_code == 0 and json.loads(status.output)["status"] == "finished"
        missing = runner.invoke(main, ["status", "00000000-0000-0000-0000-000000000000", "--api", stack.api_url])
        assert missing.exit_code != 0 and "404" in missing.output
        anonymous = runner.invoke(main, ["status", batch_id, "--api", stack.api_url], env={"POLAR_API_TOKEN": None})
        assert anonymous.exit_code != 0 and "401" in anonymous.output


def test_submit_rows_through_a_template(database_url: str, broker_url: str, tmp_path: Path) -> None:
    defaults = json.dumps({"timeout_seconds": 90, "metadata": {"source": "cli-test"}})
    args = ["submit", str(ARITHMETIC_ROWS), "--template", str(ARITHMETIC_TEMPLATE), "--limit", "3", "--samples", "2"]
    runner = CliRunner()
    bad = runner.invoke(main, [*args, "--defaults", '{"reconstruction": "bogus"}', "--api", "http://127.0.0.1:9"])
    assert bad.exit_code == 1 and f"{ARITHMETIC_ROWS}:1: reconstruction: " in bad.output  # refused before sending
    with running_stack(database_url, broker_url, tmp_path) as stack:
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
