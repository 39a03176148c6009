"""Long-polls cannot take every API thread: beyond ``POLAR_FEED_MAX_WAITERS`` feed requests waiting at once in a
process, the next one that would wait gets a 429 with ``Retry-After`` at once (one with data answers as always)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from flask import Flask

from polar.config import load_config
from web.api import create_app

TOKEN = "test-admin-token-" + "1" * 24


def app(database_url: str, broker_url: str, tmp_path: Path, **env: str) -> Flask:
    settings = {"POLAR_DATABASE_URL": database_url, "POLAR_BROKER_URL": broker_url, "POLAR_API_TOKEN": TOKEN, **env}
    return create_app(load_config(settings, cwd=tmp_path))


def test_feed_waiters_are_bounded(database_url: str, broker_url: str, tmp_path: Path) -> None:
    api = app(database_url, broker_url, tmp_path, POLAR_FEED_MAX_WAITERS="1")
    headers = {"Authorization": f"Bearer {TOKEN}"}
    first: dict[str, int] = {}

    def hold() -> None:
        first["status"] = api.test_client().get("/v1/trajectories?wait=2", headers=headers).status_code

    holder = threading.Thread(target=hold)
    holder.start()
    time.sleep(0.5)  # the first request is waiting now
    started = time.monotonic()
    second = api.test_client().get("/v1/trajectories?wait=2", headers=headers)
    assert time.monotonic() - started < 1.0
    assert second.status_code == 429 and second.headers["Retry-After"] == "1"
    assert "POLAR_FEED_MAX_WAITERS" in second.json["error"]["message"]
    assert api.test_client().get("/v1/trajectories?wait=0", headers=headers).status_code == 200  # no wait: no slot
    holder.join()
    assert first["status"] == 200
    assert api.test_client().get("/v1/trajectories?wait=0.3", headers=headers).status_code == 200  # slot given back
