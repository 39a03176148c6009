"""What a task asks of its runtime is either enforced or refused: the deployment's default backend fills in for
tasks that name none, and limits or a read-only root outside Docker are a 400, not silently ignored."""

from __future__ import annotations

from typing import Any

import pytest

from polar.contract.task_request import parse_batch_request
from polar.errors import ValidationError
from polar.lifecycle.batches import with_default_runtime
from polar.runtimes import check_runtime


def batch(*runtimes: dict[str, Any]) -> Any:
    tasks = [
        {"task_id": f"t{i}", "instruction": "i", "harness": {"name": "command", "command": "true"}, "runtime": runtime}
        for i, runtime in enumerate(runtimes)
    ]
    return parse_batch_request({"tasks": tasks})


def test_tasks_that_name_no_backend_get_the_deployments_default() -> None:
    request = with_default_runtime(batch({}, {"backend": "local"}), "bwrap")
    assert [task.runtime.backend for task in request.tasks] == ["bwrap", "local"]


@pytest.mark.parametrize(
    ("runtime", "field"),
    [
        ({"backend": "local", "limits": {"memory_mb": 512}}, "tasks[0].runtime.limits"),
        ({"backend": "bwrap", "limits": {"pids": 64}}, "tasks[0].runtime.limits"),
        ({"backend": "bwrap", "read_only_root": True}, "tasks[0].runtime.read_only_root"),
        ({"workdir": "/testbed"}, "tasks[0].runtime.workdir"),  # no backend named; the default is local
    ],
)
def test_what_only_docker_enforces_is_refused_elsewhere(runtime: dict[str, Any], field: str) -> None:
    spec = with_default_runtime(batch(runtime), "local").tasks[0].runtime
    with pytest.raises(ValidationError) as refused:
        check_runtime(spec, "tasks[0].runtime")
    assert refused.value.field == field


def test_a_default_backend_that_does_not_exist_is_refused_at_start() -> None:
    from polar.config import load_config

    with pytest.raises(ValidationError, match="POLAR_DEFAULT_RUNTIME"):
        load_config({"POLAR_DEFAULT_RUNTIME": "vm"})
