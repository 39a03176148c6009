"""The batches list and one batch per task and per node, on Postgres: each sample counted by its latest attempt."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa

from polar.errors import NotFound
from polar.inspection.overview import batch_overview, histogram, list_batches
from polar.services import Services
from polar.storage.models import Session
from tests.stage_calls import command_task, domain_services, submit_tasks


def test_histograms_use_the_unit_interval_when_they_can() -> None:
    unit = histogram([0.0, 0.05, 0.5, 1.0, 1.0])
    assert unit is not None and (unit.low, unit.high) == (0.0, 1.0)
    assert unit.counts == (2, 0, 0, 0, 0, 1, 0, 0, 0, 2)
    wide = histogram([-2.0, 2.0, float("nan")], bins=4)
    assert wide is not None and (wide.low, wide.high, wide.counts) == (-2.0, 2.0, (1, 0, 0, 1))
    assert [round(start, 6) for start, _, _ in wide.bins()] == [-2.0, -1.0, 0.0, 1.0]
    same = histogram([3.0, 3.0])
    assert same is not None and (same.low, same.high, sum(same.counts)) == (2.5, 3.5, 2)
    assert histogram([]) is None and histogram([float("inf")]) is None


def settle(services: Services, batch_id: uuid.UUID, task_id: str, sample: int, **values: object) -> uuid.UUID:
    with services.db.unit() as db:
        row = db.scalars(
            sa.select(Session).where(Session.batch_id == batch_id, Session.task_id == task_id,
                                     Session.sample_index == sample)
        ).one()  # fmt: skip
        for name, value in values.items():
            setattr(row, name, value)
        return row.id


def test_batches_newest_first_and_one_batch_broken_down(database_url: str, tmp_path: Path) -> None:
    services = domain_services(database_url, tmp_path)
    older = submit_tasks(services, command_task("a", "true", samples=3), command_task("b", "true"))
    newer = submit_tasks(services, command_task("c", "true"))
    first = list_batches(services, limit=1, offset=0)
    assert [b["batch_id"] for b in first["items"]] == [str(newer)]
    assert (first["total"], first["next_offset"]) == (2, 1)
    second = list_batches(services, limit=1, offset=1)
    assert [b["batch_id"] for b in second["items"]] == [str(older)] and second["next_offset"] is None

    settle(services, older, "a", 0, state="completed", reward=1.0, node="n1")
    settle(services, older, "a", 1, state="completed", reward=0.0, node="n1")
    settle(services, older, "a", 2, state="running", node="n2")
    # b's first attempt was lost to the infrastructure; its retry completed.
    lost = settle(services, older, "b", 0, state="failed", node="n2", outcome_class="infrastructure")
    with services.db.unit() as db:
        original = db.get(Session, lost)
        assert original is not None
        retry = Session(batch_id=older, task_pk=original.task_pk, task_id="b", sample_index=0, attempt=2,
                        state="completed", reward=1.0, node="n1", retry_of=lost)  # fmt: skip
        db.add(retry)
        db.flush()
        original.retried_as = retry.id

    overview = batch_overview(services, older)
    a, b = overview.tasks
    assert (a.task_id, a.counts, a.finished, a.accepted, a.mean_reward) == ("a", {"completed": 2, "running": 1}, 2, 1,
                                                                            0.5)  # fmt: skip
    assert a.acceptance_rate == 0.5 and a.histogram is not None and sum(a.histogram.counts) == 2
    assert (b.counts, b.finished, b.accepted) == ({"completed": 1}, 1, 1)
    assert overview.nodes == {"n1": {"completed": 3}, "n2": {"running": 1}}
    assert (overview.finished, overview.accepted, overview.acceptance_rate) == (3, 2, 2 / 3)
    assert batch_overview(services, older, min_reward=0.0).accepted == 3
    assert batch_overview(services, older, min_reward=1.5).accepted == 0

    listed = list_batches(services, limit=10, offset=0)["items"][1]
    assert listed["counts"] == {"completed": 3, "running": 1} and listed["status"] == "running"
    with pytest.raises(NotFound):
        batch_overview(services, uuid.uuid4())
