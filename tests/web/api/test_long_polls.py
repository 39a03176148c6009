"""Long-polls cannot take every API thread: beyond ``POLAR_FEED_MAX_WAITERS`` feed requests waiting at once in a
process, the next one that would wait gets a 429 with ``Retry-After`` at once (one with data answers as always)."""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from flask import Flask

from polar.config import load_config
from polar.training import feed
from tests.processes import HANG_GUARD_S
from web.api import create_app

TOKEN = "test-admin-token-" + "1" * 24


def app(database_url: str, broker_url: str, tmp_path: Path, **env: str) -> Flask:
    settings = {"POLAR_DATABASE_URL": database_url, "POLAR_BROKER_URL": broker_url, "POLAR_API_TOKEN": TOKEN, **env}
    return create_app(load_config(settings, cwd=tmp_path))


def test_feed_waiters_are_bounded(
    database_url: str, broker_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    api = app(database_url, broker_url, tmp_path, POLAR_FEED_MAX_WAITERS="1")
    headers = {"Authorization": f"Bearer {TOKEN}"}
    first: dict[str, int] = {}
    # Feed reads by thread: a request reads once before it would wait, then once per poll while it waits. The
    # holder's first read inside its wait (it holds the only slot by then) is kept until the test lets go, so the
    # order of events, not a clock, says what was answered while the slot was taken.
    reads: Counter[int] = Counter()
    waiting, let_go = threading.Event(), threading.Event()
    real_read = feed.read_feed

    def read_feed(*args: Any, **kwargs: Any) -> feed.FeedPage:
        reads[threading.get_ident()] += 1
        if threading.current_thread() is holder and reads[threading.get_ident()] == 2:
            waiting.set()
            let_go.wait(HANG_GUARD_S)
        return real_read(*args, **kwargs)

    monkeypatch.setattr(feed, "read_feed", read_feed)

    def hold() -> None:
        first["status"] = api.test_client().get("/v1/trajectories?wait=2", headers=headers).status_code

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert waiting.wait(HANG_GUARD_S), "the first request never waited"
        second = api.test_client().get("/v1/trajectories?wait=2", headers=headers)
        # Refused while the first still held the slot, having read the feed once: it never polled (waited).
        assert holder.is_alive() and reads[threading.get_ident()] == 1
        assert second.status_code == 429 and second.headers["Retry-After"] == "1"
        assert "POLAR_FEED_MAX_WAITERS" in second.json["error"]["message"]
        assert api.test_client().get("/v1/trajectories?wait=0", headers=headers).status_code == 200  # no wait: no slot
        assert holder.is_alive()
    finally:
        let_go.set()
        holder.join(HANG_GUARD_S)
    assert not holder.is_alive() and first["status"] == 200
    assert api.test_client().get("/v1/trajectories?wait=0.3", headers=headers).status_code == 200  # slot given back
