"""``polar submit``'s argument rules, refused before anything is built or sent: FILE or ``--harbor DIR``, one default
``--harness`` (``TASK=NAME`` for the others, naming task folders that exist), no row options with ``--harbor``
(the whole path runs in tests/e2e/test_harbor.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from polar.local.cli import main

TASKS = str(Path(__file__).resolve().parents[2] / "e2e" / "harbor_tasks")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "give FILE or --harbor DIR"),
        (["--harbor", TASKS, "--harness", "a", "--harness", "b"], "one default --harness at most"),
        (["--harbor", TASKS, "--harness", "nope=pi", "--harness", "oracle"], "not under"),
        (["--harbor", TASKS, "--swebench"], "--harbor takes no --template"),
        (["--harbor", TASKS], "name a harness"),
        (["polar/datasets/arithmetic.jsonl", "--harness", "pi"], "--harness goes with --harbor"),
    ],
)
def test_refused(args: list[str], message: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(Path(__file__).resolve().parents[3])
    done = CliRunner().invoke(main, ["submit", *args])
    assert done.exit_code != 0 and message in done.output, done.output
