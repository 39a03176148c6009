"""The proxy process's bound on bytes of bodies parsed at once: a parse past it waits for room, then is refused
with ``Busy`` (on record as the infrastructure's); a body larger than the whole budget is parsed alone."""

from __future__ import annotations

import threading

import pytest

from polar.errors import Busy
from polar.proxy.parse_budget import ParseBudget


def test_a_parse_past_the_budget_waits_for_room_and_then_runs() -> None:
    budget = ParseBudget(100, wait_s=30)
    first_in, release, second_in = threading.Event(), threading.Event(), threading.Event()

    def first() -> None:
        with budget.hold(80):
            first_in.set()
            release.wait(30)

    def second() -> None:
        with budget.hold(50):
            second_in.set()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    threads[0].start()
    assert first_in.wait(30)
    threads[1].start()
    assert not second_in.wait(0.3) and budget.held == 80  # 80 + 50 > 100: it waits
    release.set()
    assert second_in.wait(30)
    for thread in threads:
        thread.join(30)
    assert budget.held == 0


def test_a_parse_that_finds_no_room_in_time_is_busy_and_holds_nothing() -> None:
    budget = ParseBudget(100, wait_s=0.1)
    with budget.hold(100):
        with pytest.raises(Busy, match="POLAR_PROXY_PARSE_BYTES"), budget.hold(1):
            pass
        assert budget.held == 100
    assert budget.held == 0


def test_a_body_larger_than_the_budget_is_parsed_alone() -> None:
    budget = ParseBudget(100, wait_s=0.1)
    with budget.hold(10_000):
        assert budget.held == 100
        with pytest.raises(Busy), budget.hold(1):
            pass
