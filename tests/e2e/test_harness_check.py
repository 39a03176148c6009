"""``polar harness check`` as a user runs it: on embedded defaults, on a preset CLI with TITO and on a user's own
``command`` harness; it prints each call and the per-chain merge rate, and exits 0 when every break is explained."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from polar.harnesses.install import install

REPO = Path(__file__).resolve().parents[2]
POLAR = str(Path(sys.executable).with_name("polar"))


def check(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [POLAR, "harness", "check", *args, "--dir", str(tmp_path / "state")]
    return subprocess.run(command, capture_output=True, text=True, timeout=540, cwd=tmp_path)


def test_a_preset_with_tito(tmp_path: Path) -> None:
    # The file, then one round of the plan's other steps (read, list, run, write, edit, read back); each CLI over 20
    # steps, with and without TITO, is tests/e2e/test_harness_long_sessions.py.
    install(["pi"])
    done = check(tmp_path, "pi", "--turns", "7", "--tito")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "merge rate 100% overall, 100% on the main chain (8 calls)" in done.stdout
    assert "completed, 8 calls, 1 chains" in done.stdout


def test_a_users_own_command_harness(tmp_path: Path) -> None:
    agent = f"{sys.executable} {REPO / 'tests/e2e/agents/shell_loop.py'} {{instruction}}"
    done = check(tmp_path, "command", "--command", agent, "--turns", "6")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert sum(1 for line in lines if line.rstrip().endswith("extended")) == 6
    assert "merge rate 100% overall" in done.stdout


def test_flags_that_do_not_go_together(tmp_path: Path) -> None:
    done = check(tmp_path, "pi", "--command", "x {instruction}")
    assert done.returncode == 2 and "--command goes with NAME=command" in done.stderr
