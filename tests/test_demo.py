"""``polar demo`` on embedded defaults (SQLite, the filesystem broker), as ``make demo`` runs it on a fresh
machine: a small batch end to end, a reward table, and a trajectories file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def test_demo_runs_end_to_end_on_embedded_defaults(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLAR_")}
    result = subprocess.run(
        [sys.executable, "-m", "polar", "demo", "--tasks", "2", "--samples", "2", "--out", "out.jsonl"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "4 sessions, 4 completed" in result.stdout
    assert "arith-00" in result.stdout and "arith-01" in result.stdout
    assert (tmp_path / ".polar" / "polar.db").exists()
    lines = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert len(lines) == 8  # two calls per session, per_request
    for line in lines:
        assert len(line["token_ids"]) == len(line["loss_mask"]) == len(line["logprobs"])
        assert line["reward"] == 1.0
