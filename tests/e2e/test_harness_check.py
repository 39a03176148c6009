"""``polar harness check`` as a user runs it. Its runs are docs/harnesses.md's own block, run as written by
``tests/e2e/test_doc_commands.py`` on embedded defaults: Claude Code over 30 steps with TITO and the reader's own
``command`` harness over 20, each checked to complete and merge into one chain (a session that failed exits 1:
``tests/polar/local/test_harness_check.py``). Each CLI over 20 steps, with and without TITO, is
``tests/e2e/test_harness_long_sessions.py``. What is left here: the flags it refuses before starting anything."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

POLAR = str(Path(sys.executable).with_name("polar"))


def check(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [POLAR, "harness", "check", *args, "--dir", str(tmp_path / "state")]
    return subprocess.run(command, capture_output=True, text=True, timeout=540, cwd=tmp_path)


def test_flags_that_do_not_go_together(tmp_path: Path) -> None:
    done = check(tmp_path, "pi", "--command", "x {instruction}")
    assert done.returncode == 2 and "--command goes with NAME=command" in done.stderr
    done = check(tmp_path, "command")
    assert done.returncode == 2 and "NAME=command needs --command" in done.stderr
