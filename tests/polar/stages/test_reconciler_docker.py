"""The reconciler removes this node's Docker containers whose session has ended or is unknown."""

from __future__ import annotations

import uuid
from pathlib import Path

from polar.contract.task_request import RuntimeSpec
from polar.runtimes import create_runtime
from polar.stages.reconciler import reconcile
from tests.docker_engine import containers_of, require_docker_image
from tests.stage_calls import domain_services


def test_reconciler_reaps_orphaned_containers(database_url: str, tmp_path: Path) -> None:
    require_docker_image()
    services = domain_services(database_url, tmp_path)
    session_id = uuid.uuid4()  # no such session
    orphan = create_runtime(session_id, RuntimeSpec(backend="docker"), services.config)
    try:
        assert containers_of(session_id) == [orphan.handle["container"][:12]]
        assert reconcile(services)["containers_reaped"] >= 1
        assert not orphan.is_alive()
        assert containers_of(session_id) == []
    finally:
        orphan.destroy()
