"""Per-session call limits: the in-process limiter and the Redis one (against the machine's real Redis), with the
same contract: at most ``max_concurrent`` calls in flight, at most ``max_calls`` in all, sessions apart."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
import redis

from polar.config import load_config
from polar.errors import TooManyCalls
from polar.local.launcher import free_port
from polar.proxy.limits import CallLimiter, CallLimits, LocalLimiter, RedisLimiter, call_limiter
from tests.conftest import redis_database
from tests.processes import wait_until


@pytest.fixture
def redis_url() -> Iterator[str]:
    with redis_database() as url:
        yield url


@pytest.fixture(params=["local", "redis"])
def limiter(request: pytest.FixtureRequest) -> Iterator[CallLimiter]:
    if request.param == "local":
        yield LocalLimiter()
        return
    with redis_database() as url:
        limiter = RedisLimiter(url, hold_s=60)
        yield limiter
        limiter.close()


def limits(max_concurrent: int = 4, max_calls: int = 100) -> CallLimits:
    return CallLimits(max_concurrent=max_concurrent, max_calls=max_calls, keep_s=600)


def test_calls_beyond_max_concurrent_are_refused_until_one_ends(limiter: CallLimiter) -> None:
    session = uuid.uuid4()
    with ExitStack() as held:
        for _ in range(3):
            held.enter_context(limiter.slot(session, limits(max_concurrent=3)))
        with pytest.raises(TooManyCalls) as refused, limiter.slot(session, limits(max_concurrent=3)):
            pass
        assert refused.value.retry_after_s is not None and refused.value.retry_after_s >= 1
        assert "max_concurrent_calls (3)" in str(refused.value)
    with limiter.slot(session, limits(max_concurrent=3)):  # the three ended: room again
        pass


def test_max_calls_counts_every_admitted_call_and_refusals_say_waiting_will_not_help(limiter: CallLimiter) -> None:
    session = uuid.uuid4()
    for _ in range(3):
        with limiter.slot(session, limits(max_calls=3)):
            pass
    for _ in range(2):
        with pytest.raises(TooManyCalls) as refused, limiter.slot(session, limits(max_calls=3)):
            pass
        assert refused.value.retry_after_s is None and "max_calls (3)" in str(refused.value)


def test_a_call_refused_for_concurrency_does_not_use_up_the_total(limiter: CallLimiter) -> None:
    session, tight = uuid.uuid4(), limits(max_concurrent=1, max_calls=2)
    with limiter.slot(session, tight):
        for _ in range(5):
            with pytest.raises(TooManyCalls), limiter.slot(session, tight):
                pass
    with limiter.slot(session, tight):
        pass
    with pytest.raises(TooManyCalls) as refused, limiter.slot(session, tight):
        pass
    assert refused.value.retry_after_s is None


def test_uncounted_calls_take_a_slot_but_not_the_total(limiter: CallLimiter) -> None:
    session, tight = uuid.uuid4(), limits(max_concurrent=1, max_calls=1)
    for _ in range(5):
        with limiter.slot(session, tight, counted=False):
            pass
    with (
        limiter.slot(session, tight, counted=False),
        pytest.raises(TooManyCalls),
        limiter.slot(session, tight, counted=False),
    ):
        pass
    with limiter.slot(session, tight):  # the one counted call is still there
        pass


def test_sessions_have_limits_of_their_own(limiter: CallLimiter) -> None:
    runaway, other = uuid.uuid4(), uuid.uuid4()
    with limiter.slot(runaway, limits(max_calls=1)):
        pass
    with pytest.raises(TooManyCalls), limiter.slot(runaway, limits(max_calls=1)):
        pass
    for _ in range(3):
        with limiter.slot(other, limits(max_calls=3)):
            pass


def test_racing_threads_get_exactly_max_concurrent_slots(limiter: CallLimiter) -> None:
    session, outcomes, lock = uuid.uuid4(), [], threading.Lock()
    start, done = threading.Barrier(24), threading.Event()

    def call() -> None:
        start.wait()
        try:
            with limiter.slot(session, limits(max_concurrent=5)):
                with lock:
                    outcomes.append("admitted")
                done.wait(120)  # held until every thread has its answer (a hang guard, not a speed claim)
        except TooManyCalls:
            with lock:
                outcomes.append("refused")

    threads = [threading.Thread(target=call) for _ in range(24)]
    for thread in threads:
        thread.start()
    try:
        wait_until(lambda: len(outcomes) == 24, 60, "every thread admitted or refused")  # a hang guard
    finally:
        done.set()
    for thread in threads:
        thread.join()
    assert outcomes.count("admitted") == 5 and outcomes.count("refused") == 19


def test_redis_limits_are_shared_by_every_proxy_process(redis_url: str) -> None:
    """Two limiters on one Redis stand for two gunicorn workers (or two proxy machines)."""
    first, second, session = RedisLimiter(redis_url, hold_s=60), RedisLimiter(redis_url, hold_s=60), uuid.uuid4()
    try:
        with (
            first.slot(session, limits(max_concurrent=1, max_calls=3)),
            pytest.raises(TooManyCalls),
            second.slot(session, limits(max_concurrent=1, max_calls=3)),
        ):
            pass
        with second.slot(session, limits(max_concurrent=1, max_calls=3)):
            pass
        with first.slot(session, limits(max_concurrent=1, max_calls=3)):
            pass
        with pytest.raises(TooManyCalls) as refused, second.slot(session, limits(max_concurrent=1, max_calls=3)):
            pass
        assert refused.value.retry_after_s is None
    finally:
        first.close()
        second.close()


def test_a_crashed_proxys_calls_stop_counting_after_hold_s(redis_url: str) -> None:
    limiter, session = RedisLimiter(redis_url, hold_s=1), uuid.uuid4()
    try:
        crashed = limiter.slot(session, limits(max_concurrent=1))
        crashed.__enter__()  # never left: the process holding it died
        time.sleep(1.2)  # it is older than hold_s now
        # Judged with an hour's hold_s it still counts (however long a loaded machine took to get here)...
        limiter.hold_s = 3600
        with pytest.raises(TooManyCalls), limiter.slot(session, limits(max_concurrent=1)):
            pass
        limiter.hold_s = 1  # ...and with 1 s, it no longer does
        with limiter.slot(session, limits(max_concurrent=1)):
            pass
    finally:
        limiter.close()


def test_redis_keys_expire_and_an_ended_call_leaves_nothing_in_flight(redis_url: str) -> None:
    limiter, session = RedisLimiter(redis_url, hold_s=60), uuid.uuid4()
    client = redis.Redis.from_url(redis_url)
    try:
        with limiter.slot(session, CallLimits(max_concurrent=2, max_calls=10, keep_s=300)):
            keys = sorted(key.decode() for key in client.keys("*"))
            assert keys == [f"polar:calls:{{{session}}}:inflight", f"polar:calls:{{{session}}}:total"]
            assert all(0 < client.ttl(key) <= 300 for key in keys)
        assert client.zcard(f"polar:calls:{{{session}}}:inflight") == 0
        assert client.get(f"polar:calls:{{{session}}}:total") == b"1"
    finally:
        client.close()
        limiter.close()


def test_without_redis_the_limits_still_hold_in_process() -> None:
    """Redis unreachable mid-run: calls are neither failed nor let through unbounded; this process's own
    counts stand in until Redis is back."""
    limiter, session = RedisLimiter(f"redis://127.0.0.1:{free_port()}/0", hold_s=60), uuid.uuid4()
    try:
        with (
            limiter.slot(session, limits(max_concurrent=1, max_calls=2)),
            pytest.raises(TooManyCalls),
            limiter.slot(session, limits(max_concurrent=1, max_calls=2)),
        ):
            pass
        with limiter.slot(session, limits(max_concurrent=1, max_calls=2)):
            pass
        with pytest.raises(TooManyCalls), limiter.slot(session, limits(max_concurrent=1, max_calls=2)):
            pass
    finally:
        limiter.close()


def test_the_local_limiter_forgets_idle_sessions_after_keep_s() -> None:
    now = [1000.0]
    limiter, session = LocalLimiter(clock=lambda: now[0], sweep_every_s=5), uuid.uuid4()
    short = CallLimits(max_concurrent=1, max_calls=1, keep_s=10)
    with limiter.slot(session, short):
        pass
    assert limiter.tracked() == 1
    now[0] += 11
    with limiter.slot(uuid.uuid4(), short):  # the next call after sweep_every_s forgets what idled past keep_s
        pass
    assert limiter.tracked() == 1


def test_task_fields_win_over_the_deployment_defaults(tmp_path: Path) -> None:
    config = load_config({"POLAR_SESSION_MAX_CONCURRENT_CALLS": "3", "POLAR_SESSION_MAX_CALLS": "50"}, cwd=tmp_path)
    assert (config.session_max_concurrent_calls, config.session_max_calls) == (3, 50)
    defaults = load_config({}, cwd=tmp_path)
    assert (defaults.session_max_concurrent_calls, defaults.session_max_calls) == (16, 2000)
    assert CallLimits.of_task(config, None, None, 120.0) == CallLimits(3, 50, keep_s=120 + 2 * 600 + 60)
    assert CallLimits.of_task(config, 7, 9, None).max_concurrent == 7
    assert CallLimits.of_task(config, 7, 9, None).max_calls == 9


@pytest.mark.parametrize("value", ["0", "-1", "x", "2.5"])
def test_bad_deployment_defaults_name_the_variable(value: str, tmp_path: Path) -> None:
    from polar.errors import ValidationError

    with pytest.raises(ValidationError) as caught:
        load_config({"POLAR_SESSION_MAX_CALLS": value}, cwd=tmp_path)
    assert caught.value.field == "POLAR_SESSION_MAX_CALLS"


def test_the_limiter_follows_the_deployment(redis_url: str, tmp_path: Path) -> None:
    embedded = call_limiter(load_config({}, cwd=tmp_path))
    shared = call_limiter(load_config({"POLAR_REDIS_URL": redis_url}, cwd=tmp_path))
    try:
        assert isinstance(embedded, LocalLimiter) and isinstance(shared, RedisLimiter)
    finally:
        shared.close()


def test_a_refusal_is_a_warning_once_per_session_and_limit(
    limiter: CallLimiter, caplog: pytest.LogCaptureFixture
) -> None:
    session, tight = uuid.uuid4(), limits(max_concurrent=1, max_calls=1)
    with caplog.at_level("DEBUG", logger="polar.proxy.limits"):
        with limiter.slot(session, tight):
            for _ in range(3):
                with pytest.raises(TooManyCalls), limiter.slot(session, tight, counted=False):
                    pass
        for _ in range(3):
            with pytest.raises(TooManyCalls), limiter.slot(session, tight):
                pass
    refusals = [r for r in caplog.records if "refused" in r.getMessage()]
    assert [r.levelname for r in refusals] == ["WARNING", "DEBUG", "DEBUG"] * 2
    assert all(str(session) in r.getMessage() for r in refusals)


def test_count_tokens_calls_have_their_own_total_beside_max_calls(limiter: CallLimiter) -> None:
    """Audit G10: counting tokens counted toward nothing. Now it counts toward ``max_count_tokens``, and neither
    total uses up the other."""
    session = uuid.uuid4()
    tight = CallLimits(max_concurrent=4, max_calls=2, keep_s=600, max_count_tokens=3)
    for _ in range(3):
        with limiter.slot(session, tight, toward="max_count_tokens"):
            pass
    with pytest.raises(TooManyCalls) as refused, limiter.slot(session, tight, toward="max_count_tokens"):
        pass
    assert refused.value.retry_after_s is None and refused.value.limit == "max_count_tokens"
    assert "max_count_tokens (3)" in str(refused.value)
    for _ in range(2):  # the model calls' total is untouched...
        with limiter.slot(session, tight):
            pass
    with pytest.raises(TooManyCalls) as spent, limiter.slot(session, tight):
        pass
    assert spent.value.limit == "max_calls"
    with limiter.slot(uuid.uuid4(), tight, toward="max_count_tokens"):  # ...and other sessions count their own
        pass


def test_count_tokens_calls_share_the_concurrency_slots(limiter: CallLimiter) -> None:
    session = uuid.uuid4()
    tight = CallLimits(max_concurrent=1, max_calls=10, keep_s=600, max_count_tokens=10)
    with (
        limiter.slot(session, tight),
        pytest.raises(TooManyCalls) as refused,
        limiter.slot(session, tight, toward="max_count_tokens"),
    ):
        pass
    assert refused.value.limit == "max_concurrent_calls" and refused.value.retry_after_s is not None


def test_the_count_tokens_total_follows_the_deployment(tmp_path: Path) -> None:
    config = load_config({"POLAR_SESSION_MAX_COUNT_TOKENS": "7", "POLAR_MAX_COUNT_TOKENS_BYTES": "1000"}, cwd=tmp_path)
    assert CallLimits.of_task(config, None, None, None).max_count_tokens == 7
    assert config.max_count_tokens_bytes == 1000
    defaults = load_config({}, cwd=tmp_path)
    assert (defaults.session_max_count_tokens, defaults.max_count_tokens_bytes) == (2000, 4 * 1024 * 1024)
