"""The ``python`` harness imports ``module:function`` only from Polar's own agents or the operator's
``POLAR_PLUGIN_MODULES``: refused at submission, and its entry point refuses too, before importing anything."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from polar.contract.task_request import HarnessSpec
from polar.errors import PluginNotAllowed
from polar.harnesses.base import HarnessContext
from polar.harnesses.registry import HARNESSES, check_harness


def test_built_in_agents_are_allowed_by_default() -> None:
    check_harness(HarnessSpec(name="python", command="polar.agents.calculator:run"), "tasks[0].harness")


@pytest.mark.parametrize("target", ["tests.e2e.agents.slow:run", "os:system", "polar.local.cli:main"])
def test_other_targets_need_the_allow_list(target: str) -> None:
    with pytest.raises(PluginNotAllowed) as refused:
        check_harness(HarnessSpec(name="python", command=target), "tasks[0].harness")
    assert refused.value.field == "tasks[0].harness.command"
    message = refused.value.message
    assert message.startswith("tasks[0].harness.command: ") and "POLAR_PLUGIN_MODULES" in message


def test_an_allowed_prefix_admits_its_modules() -> None:
    spec = HarnessSpec(name="python", command="tests.e2e.agents.slow:run")
    check_harness(spec, "tasks[0].harness", ("tests.e2e",))


def _run(tmp_path: Path, target: str, plugin_modules: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    session_dir = tmp_path / "session"
    (session_dir / "home").mkdir(parents=True, exist_ok=True)
    context = HarnessContext(
        session_id=uuid.uuid4(),
        task_id="t",
        instruction="go",
        spec=HarnessSpec(name="python", command=target),
        proxy_url="http://127.0.0.1:9",
        proxy_key="pk-test",
        session_dir=session_dir,
        runtime_env={},
        plugin_modules=plugin_modules,
    )
    launch = HARNESSES["python"].launch(context)
    return subprocess.run(
        launch.command, env=launch.env, cwd=tmp_path, capture_output=True, text=True, timeout=120
    )  # a hang guard


def test_the_entry_point_refuses_a_target_outside_the_allow_list(tmp_path: Path) -> None:
    mark = tmp_path / "imported"
    (tmp_path / "planted.py").write_text(f"open({str(mark)!r}, 'w').close()\ndef run(i):\n    return 0\n")
    refused = _run(tmp_path, "planted:run", ())
    assert refused.returncode == 2 and "POLAR_PLUGIN_MODULES" in refused.stderr
    assert not mark.exists()
    allowed = _run(tmp_path, "planted:run", ("planted",))
    assert allowed.returncode == 0, allowed.stderr
    assert mark.exists()


def test_the_entry_point_imports_only_what_it_needs() -> None:
    """Every ``python`` session starts with this import: the harness registry, the runtimes and the Docker SDK
    cost each session about half a second of CPU before its agent ran."""
    listing = "import sys, polar.harnesses.python_entry; print(' '.join(sorted(sys.modules)))"
    loaded = set(
        subprocess.run([sys.executable, "-c", listing], capture_output=True, text=True, check=True).stdout.split()
    )
    assert {m for m in loaded if m.split(".")[0] in ("polar", "docker", "sqlalchemy", "pydantic")} == {
        "polar", "polar.errors", "polar.codec", "polar.codec.import_path", "polar.harnesses",
        "polar.harnesses.python_entry",
    }  # fmt: skip
