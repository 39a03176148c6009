"""The reconciler removes this node's Docker containers whose session has ended or is unknown."""

from __future__ import annotations

import uuid
from pathlib import Path

from polar.reconciler import reconcile
from polar.runtimes import create_runtime
from polar.task_request import RuntimeSpec
from tests.docker_engine import labelled_containers, require_docker_image
from tests.support import domain_services


def test_reconciler_reaps_orphaned_containers(database_url: str, tmp_path: Path) -> None:
    require_docker_image()
    services = domain_services(database_url, tmp_path)
    orphan = create_runtime(uuid.uuid4(), RuntimeSpec(backend="docker"), services.config)  # no such session
    try:
        assert orphan.handle["container"] in " ".join(labelled_containers()) or labelled_containers()
        assert reconcile(services)["containers_reaped"] >= 1
        assert not orphan.is_alive()
    finally:
        orphan.destroy()
    assert labelled_containers() == []
