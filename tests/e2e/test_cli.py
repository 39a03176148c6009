"""``polar submit FILE --wait`` and ``polar status`` against the real stack."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from polar.cli import main
from tests.support import command_task, running_stack


def test_submit_wait_and_status(database_url: str, broker_url: str, tmp_path: Path) -> None:
    batch_file = tmp_path / "batch.yaml"
    batch_file.write_text(json.dumps({"tasks": [command_task("cli", "echo {instruction}", samples=2)]}))
    with running_stack(database_url, broker_url, tmp_path) as stack:
        runner = CliRunner()
        submitted = runner.invoke(main, ["submit", str(batch_file), "--wait", "--api", stack.api_url])
        assert submitted.exit_code == 0, submitted.output
        first, last = submitted.output.strip().splitlines()[0], submitted.output.strip().splitlines()[-1]
        batch_id = json.loads(first)["batch_id"]
        assert json.loads(last) == {"completed": 2}
        status = runner.invoke(main, ["status", batch_id, "--api", stack.api_url])
        assert status.exit_code == 0 and json.loads(status.output)["status"] == "finished"
        missing = runner.invoke(main, ["status", "00000000-0000-0000-0000-000000000000", "--api", stack.api_url])
        assert missing.exit_code != 0 and "404" in missing.output
