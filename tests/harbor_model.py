"""Harbor's own task model (PyPI ``harbor``, which needs Python 3.12) reading task folders, so a test can show that
what Polar runs is what Harbor itself would load. Installed once into the harness cache, in a venv of its own."""

from __future__ import annotations

import fcntl
import json
import subprocess
from pathlib import Path
from typing import Any

from polar.harnesses.install import cache_dir, python_for

HARBOR_VERSION = "0.26.0"
_READ = """
import json, sys
from harbor.models.task.task import Task
found = []
for path in sys.argv[1:]:
    task = Task(path)
    found.append({"path": path, "instruction": task.instruction, "agent_timeout_sec": task.config.agent.timeout_sec,
                  "verifier_timeout_sec": task.config.verifier.timeout_sec,
                  "test": str(task.paths.discovered_test_path), "solve": str(task.paths.discovered_solve_path)})
print(json.dumps(found))
"""


def harbor_python() -> Path:
    """The interpreter of a venv holding ``harbor`` at the pinned version (made on first use)."""
    venv = cache_dir() / "venvs" / f"harbor-model-{HARBOR_VERSION}"
    python = venv / "bin" / "python"
    venv.parent.mkdir(parents=True, exist_ok=True)
    with (venv.parent / ".harbor-model.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (venv / ".installed").exists():
            subprocess.run([python_for("3.12"), "-m", "venv", "--clear", str(venv)], check=True, timeout=300)
            pip = [
                str(python),
                "-m",
                "pip",
                "install",
                "-q",
                "--disable-pip-version-check",
                f"harbor=={HARBOR_VERSION}",
            ]
            subprocess.run(pip, check=True, timeout=1200, capture_output=True)
            (venv / ".installed").touch()
    return python


def harbor_reads(folders: list[Path]) -> list[dict[str, Any]]:
    """What Harbor's ``Task`` model reads from each folder (it raises on a folder it would not run)."""
    done = subprocess.run([str(harbor_python()), "-c", _READ, *map(str, folders)], capture_output=True, text=True,
                          timeout=300, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return list(json.loads(done.stdout))
