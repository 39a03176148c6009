"""A stack's processes import only what they serve: the API validates tasks without importing a runtime's or an
evaluator's implementation (or the Docker SDK) until a task names one, and a worker loads them when a session needs
them. Each process is a fresh interpreter, as gunicorn's and Celery's are."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# Implementations a process loads only for a task that names them.
ON_DEMAND = (
    "docker",
    "polar.runtimes.docker",
    "polar.runtimes.bwrap",
    "polar.runtimes.local",
    "polar.evaluators.swebench",
    "polar.evaluators.harbor",
    "polar.evaluators.reward_file",
    "polar.evaluators.test_on_output",
)


def loaded_after(statement: str) -> set[str]:
    """The modules of ``ON_DEMAND`` a fresh interpreter holds after ``statement``."""
    probe = f"import json, sys\n{statement}\nprint(json.dumps([m for m in {list(ON_DEMAND)!r} if m in sys.modules]))"
    found = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True)
    return set(json.loads(found.stdout.splitlines()[-1]))


@pytest.mark.parametrize(
    "statement",
    ["import web.api; web.api.create_app", "import web.proxy; web.proxy.create_app", "import workers"],
    ids=["api", "proxy", "workers"],
)
def test_a_process_imports_no_runtime_or_evaluator_it_was_not_asked_for(statement: str) -> None:
    assert loaded_after(statement) == set()


def test_a_backend_and_an_evaluator_load_when_first_named() -> None:
    statement = (
        "from polar.evaluators import EVALUATORS\nfrom polar.runtimes import RUNTIMES\n"
        "RUNTIMES['local'], EVALUATORS['reward_file']"
    )
    assert loaded_after(statement) == {"polar.runtimes.local", "polar.evaluators.reward_file"}
