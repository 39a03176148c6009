"""Submission asks the Docker engine about each image once, not once per task (audit F21: a 1,024-row gym group
was 1,024 Docker round trips, 3 s each when Docker is slow). Counted, with the engine probe stubbed (no Docker)."""

from __future__ import annotations

from pathlib import Path

import pytest

import polar.runtimes
from polar.config import load_config
from polar.contract.task_request import parse_batch_request
from polar.errors import ValidationError
from polar.lifecycle.batches import _check_available
from tests.stage_calls import command_task


def _docker_tasks(images: list[str]) -> dict:
    return {"tasks": [{**command_task(f"t{i}", "true"), "runtime": {"backend": "docker", "image": image}}
                      for i, image in enumerate(images)]}  # fmt: skip


def test_each_image_is_asked_about_once_per_submission(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str | None] = []
    monkeypatch.setattr(polar.runtimes, "engine_problem", lambda image=None: asked.append(image))
    config = load_config({"POLAR_DATABASE_URL": "sqlite://"}, cwd=tmp_path)
    _check_available(parse_batch_request(_docker_tasks(["img-a", "img-b"] * 50)), config)
    assert sorted(asked) == ["img-a", "img-b"]  # before: 100 probes, one per task
    _check_available(parse_batch_request(_docker_tasks(["img-a"])), config)
    assert len(asked) == 3  # a new submission asks again (an image may have been pulled or removed since)


def test_a_missing_image_still_refuses_the_task_that_names_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str | None] = []

    def problem(image: str | None = None) -> str | None:
        asked.append(image)
        return "image 'img-b' is not on the Docker engine" if image == "img-b" else None

    monkeypatch.setattr(polar.runtimes, "engine_problem", problem)
    config = load_config({"POLAR_DATABASE_URL": "sqlite://"}, cwd=tmp_path)
    with pytest.raises(ValidationError) as refused:
        _check_available(parse_batch_request(_docker_tasks(["img-a", "img-a", "img-b"])), config)
    assert refused.value.field == "tasks[2].runtime.backend" and asked == ["img-a", "img-b"]
