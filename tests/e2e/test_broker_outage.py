"""The broker is down while a batch is admitted: the submission still answers 201 (the batch and what is due are
committed; nothing was half-sent), and once the broker is back the batch finishes with every session terminal.
Before the outbox, the API answered 500, the batch existed anyway, and sessions admitted but never sent stayed
in ``init`` forever."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.private_services import PrivateRedis
from tests.stacks import running_stack
from tests.stage_calls import command_task


@pytest.fixture
def redis_server() -> Iterator[PrivateRedis]:
    server = PrivateRedis()
    server.start()
    yield server
    server.close()


def test_submission_while_the_broker_is_down(database_url: str, redis_server: PrivateRedis, tmp_path: Path) -> None:
    env = {"POLAR_READY_BUFFER": "6", "POLAR_REQUEUE_AFTER": "10"}
    with running_stack(database_url, redis_server.url, tmp_path, run_concurrency=2, env=env, supervise=True) as stack:
        redis_server.kill()
        started = time.monotonic()
        submitted = stack.client.submit({"tasks": [command_task("t", "true", samples=15)]})
        # A hang guard, not a speed claim: a submission that waited for the broker would wait for as long as it is
        # down (Celery retries its connection forever); this one is answered with the broker still down.
        assert submitted["num_sessions"] == 15 and time.monotonic() - started < 60
        due = stack.sql("SELECT count(*) FROM sessions WHERE state = 'init' AND stage_enqueued_at IS NULL")[0][0]
        assert due == 6  # admitted, due, unsent: the outbox holds them
        time.sleep(2)
        redis_server.start()
        final = stack.wait(submitted["batch_id"])
        assert final["counts"] == {"completed": 15}
        assert (
            stack.sql("SELECT count(*) FROM sessions WHERE due_stage IS NOT NULL AND stage_enqueued_at IS NULL")[0][0]
            == 0
        )
