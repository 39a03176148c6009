"""Each stage message reaches its own queue and no other, on Redis and on the embedded filesystem broker."""

from __future__ import annotations

import uuid
from pathlib import Path

import redis

from polar.config import load_config
from polar.contract.dispatch import Stage
from workers.app import create_celery
from workers.dispatch import CeleryDispatcher


def _send_one_of_each(env: dict[str, str], tmp_path: Path) -> None:
    app = create_celery(load_config(env, cwd=tmp_path))
    try:
        dispatcher = CeleryDispatcher(app)
        for stage in Stage:
            dispatcher.send(stage, uuid.uuid4())
    finally:
        app.close()


def test_redis_queues_get_only_their_stage(broker_url: str, tmp_path: Path) -> None:
    _send_one_of_each({"POLAR_BROKER_URL": broker_url}, tmp_path)
    client = redis.Redis.from_url(broker_url)
    try:
        assert {stage.value: client.llen(stage.value) for stage in Stage} == {stage.value: 1 for stage in Stage}
    finally:
        client.close()


def test_filesystem_queues_get_only_their_stage_and_keep_to_the_state_dir(tmp_path: Path) -> None:
    state = tmp_path / "state"
    env = {"POLAR_BROKER_URL": "filesystem://", "POLAR_STATE_DIR": str(state)}
    _send_one_of_each(env, tmp_path)
    names = [path.name for path in (state / "broker" / "queue").iterdir()]
    assert sorted(name.partition(".")[2] for name in names) == sorted(f"{stage.value}.msg" for stage in Stage)
    assert not (tmp_path / "control").exists()  # the exchange tables live under the state dir too
    assert (state / "broker" / "control").is_dir()
