"""The proxy's key lookup: one query gives the key's session, its state and its task's call-limit fields, in
Postgres and in embedded SQLite alike."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from polar.contract.task_request import parse_batch_request
from polar.lifecycle.batches import request_hash, submit_batch
from polar.proxy.key_owner import KeyOwner, session_state_for_key
from polar.proxy.keys import hash_key
from polar.services import Services
from polar.storage.migration import upgrade
from polar.storage.models import Session
from tests.stage_calls import command_task, domain_services


@pytest.fixture(params=["postgres", "sqlite"])
def services(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Services]:
    if request.param == "postgres":
        url = request.getfixturevalue("database_url")
    else:
        url = f"sqlite:///{tmp_path}/polar.db"
        upgrade(url)
    services = domain_services(url, tmp_path)
    yield services
    services.db.dispose()


def test_a_key_names_its_session_and_its_tasks_call_limits(services: Services) -> None:
    body = {
        "tasks": [
            command_task(
                "limited",
                "true",
                max_calls=3,
                max_concurrent_calls=2,
                timeout_seconds=120,
                over_budget="stop",
                sampling="neutralize",
            ),
            command_task("default", "true"),
        ]
    }
    batch_id = submit_batch(services, parse_batch_request(body), request_hash(body)).batch_id
    keys = {}
    with services.db.unit() as db:
        for session_id, task_id in db.execute(
            sa.select(Session.id, Session.task_id).where(Session.batch_id == batch_id)
        ):
            keys[task_id] = (session_id, f"pk-{uuid.uuid4().hex}")
            db.execute(
                sa.update(Session)
                .where(Session.id == session_id)
                .values(state="running", proxy_key_hash=hash_key(keys[task_id][1]))
            )

    limited, default = keys["limited"], keys["default"]
    assert session_state_for_key(services.db, hash_key(limited[1])) == KeyOwner(
        limited[0], "running", 2, 3, 120.0, "stop", "neutralize"
    )
    assert session_state_for_key(services.db, hash_key(default[1])) == KeyOwner(
        default[0], "running", None, None, 600.0, "refuse", "record"
    )
    assert session_state_for_key(services.db, hash_key("pk-unknown")) is None
