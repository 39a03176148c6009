"""``POST /v1/batches`` refuses code, shell and URLs a request body must not choose, with a 400 naming the field
and nothing stored: an evaluator or ``python`` harness outside ``POLAR_PLUGIN_MODULES``, a ``command`` template
that quotes ``{instruction}``, a ``callback_url`` at the host's own services."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from flask.testing import FlaskClient

from polar.config import load_config
from polar.storage.database import Database
from tests.stage_calls import command_task
from web.api import create_app

TOKEN = "test-admin-token-" + "2" * 24


def api(database_url: str, broker_url: str, tmp_path: Path) -> FlaskClient:
    env = {"POLAR_DATABASE_URL": database_url, "POLAR_BROKER_URL": broker_url, "POLAR_API_TOKEN": TOKEN}
    client = create_app(load_config(env, cwd=tmp_path)).test_client()
    client.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {TOKEN}"
    return client


def stored(database_url: str) -> int:
    db = Database(database_url)
    try:
        with db.unit() as session:
            counts = "SELECT (SELECT count(*) FROM batches) + (SELECT count(*) FROM sessions)"
            return int(session.scalar(sa.text(counts)))
    finally:
        db.dispose()


def _cases(mark: Path) -> list[tuple[dict[str, Any], str, str]]:
    popen = {"name": "subprocess:Popen", "config": {"/bin/sh": 0, "-c": 0, f"touch {mark}": 0}}
    return [
        ({"tasks": [command_task("ok", "true"), command_task("bad", "true", evaluator=popen)]},
         "tasks[1].evaluator.name", "POLAR_PLUGIN_MODULES"),
        ({"tasks": [{"task_id": "p", "instruction": "x", "harness": {"name": "python", "command": "os:system"}}]},
         "tasks[0].harness.command", "POLAR_PLUGIN_MODULES"),
        ({"tasks": [command_task("q", 'echo "{instruction}"')]},
         "tasks[0].harness.command", "write {instruction} without quotes; Polar shell-quotes it"),
        ({"callback_url": "http://169.254.169.254/latest/meta-data/", "tasks": [command_task("c", "true")]},
         "callback_url", "POLAR_CALLBACK_ALLOW"),
    ]  # fmt: skip


@pytest.mark.parametrize("case", range(4))
def test_refused_with_the_field_and_nothing_stored_or_run(
    database_url: str, broker_url: str, tmp_path: Path, case: int
) -> None:
    mark = tmp_path / "ran"
    body, field, words = _cases(mark)[case]
    response = api(database_url, broker_url, tmp_path).post("/v1/batches", json=body)
    time.sleep(0.3)  # a command started at submission would have run by now
    assert not mark.exists()
    assert response.status_code == 400, response.json
    error = response.json["error"]
    assert error["field"] == field and error["message"].startswith(f"{field}: ") and words in error["message"]
    assert stored(database_url) == 0
