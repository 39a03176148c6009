"""Early stop per group on the stage functions and a real Postgres: a group of 8 with ``early_stop: {min_usable:
4}`` settles 4 scored samples and the rest cancelled (unstarted ones at once, admitted ones before their harness
starts), none of them scored or served; the group is complete in the feed with its 4 usable samples. (A sample
whose harness had already ended when the group stopped is not a straggler: it settles as it ended.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from polar.contract.task_request import parse_batch_request
from polar.errors import ValidationError
from polar.services import Services
from polar.storage.models import Session, Task
from polar.training.feed import read_feed
from tests.polar.stages.test_circuit_breaker import run_all, submit
from tests.stage_calls import command_task, domain_services


@pytest.fixture
def services(database_url: str, tmp_path: Path) -> Services:
    return domain_services(database_url, tmp_path, ready_buffer=3)


def test_a_group_stops_once_enough_samples_are_usable(services: Services) -> None:
    batch_id = submit(services, {"tasks": [command_task("g", "true", samples=8, early_stop={"min_usable": 4})]})
    run_all(services, postrun_first=True)  # the stragglers have not finished when the fourth is scored
    with services.db.engine.connect() as connection:
        rows: list[Any] = connection.execute(
            sa.select(Session.outcome_class, Session.reward, Session.outcome).where(Session.batch_id == batch_id)
        ).all()
        stopped = connection.scalar(sa.select(Task.stopped_at).where(Task.batch_id == batch_id))
    assert stopped is not None
    assert sorted(r.outcome_class for r in rows) == ["cancelled"] * 4 + ["task"] * 4
    assert all(r.reward is None for r in rows if r.outcome_class == "cancelled")  # never scored
    page = read_feed(services, batch_id, after=0, limit=10, groups=True)
    assert len(page.items) == 4 and {item["group_scored"] for item in page.items} == {4}
    assert {item["state"] for item in page.items} == {"completed"}


def test_min_usable_is_at_most_the_samples() -> None:
    with pytest.raises(ValidationError, match="early_stop"):
        parse_batch_request({"tasks": [command_task("g", "true", samples=2, early_stop={"min_usable": 3})]})
