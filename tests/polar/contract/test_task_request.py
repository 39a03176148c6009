from __future__ import annotations

from typing import Any

import pytest

from polar.contract.task_request import CopyStep, RunStep, parse_batch_request
from polar.errors import ValidationError


def task(**extra: Any) -> dict[str, Any]:
    return {"task_id": "t1", "instruction": "do it", "harness": {"name": "command", "command": "true"}, **extra}


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ([], None, "JSON object"),
        ({}, "tasks", "required"),
        ({"tasks": []}, "tasks", "at least 1"),
        ({"tasks": [task(colour="red")]}, "tasks[0].colour", "unknown field"),
        ({"tasks": [task(num_samples="2")]}, "tasks[0].num_samples", "integer"),
        ({"tasks": [task(num_samples=0)]}, "tasks[0].num_samples", "greater than or equal to 1"),
        ({"tasks": [task(timeout_seconds=-1)]}, "tasks[0].timeout_seconds", "greater than 0"),
        ({"tasks": [task(harness={"name": "vim"})]}, "tasks[0].harness.name", "'command'"),
        ({"tasks": [task(harness={"name": "command"})]}, "tasks[0].harness", "shell command"),
        ({"tasks": [task(harness={"name": "python", "command": "x"})]}, "tasks[0].harness", "module:function"),
        ({"tasks": [task(runtime={"prepare": [{"copy": "a"}]})]}, "tasks[0].runtime.prepare[0].to", "missing"),
        ({"tasks": [task(runtime={"prepare": [{"run": 3}]})]}, "tasks[0].runtime.prepare[0].run", "string"),
        ({"tasks": [task(runtime={"backend": "vm"})]}, "tasks[0].runtime.backend", "'local'"),
        ({"tasks": [task()], "extra": 1}, "extra", "unknown field"),
        ({"tasks": [task(instruction=None)]}, "tasks[0].instruction", "string"),
        ({"tasks": [task(failure_reward="low")]}, "tasks[0].failure_reward", "valid number"),
        ({"tasks": [task(failure_reward=True)]}, "tasks[0].failure_reward", "valid number"),
        ({"tasks": [task(failure_reward=None)]}, "tasks[0].failure_reward", "valid number"),
        ({"tasks": [task(failure_reward=float("-inf"))]}, "tasks[0].failure_reward", "finite number"),
    ],
)
def test_bad_requests_name_the_field(body: Any, field: str | None, words: str) -> None:
    with pytest.raises(ValidationError) as caught:
        parse_batch_request(body)
    assert caught.value.field == field
    assert words in str(caught.value)


def test_defaults_merge_under_each_task() -> None:
    body = {
        "defaults": {"timeout_seconds": 30, "harness": {"name": "command", "command": "echo {instruction}"}},
        "tasks": [
            {"task_id": "a", "instruction": "x"},
            task(timeout_seconds=5, harness={"name": "command", "command": "ls"}),
        ],
    }
    request = parse_batch_request(body)
    assert request.tasks[0].timeout_seconds == 30
    assert request.tasks[0].harness.command == "echo {instruction}"
    assert request.tasks[1].timeout_seconds == 5
    assert request.tasks[1].harness.command == "ls"


def test_prepare_steps_parse_in_order() -> None:
    request = parse_batch_request({"tasks": [task(runtime={"prepare": [{"run": "ls"}, {"copy": "/a", "to": "b"}]})]})
    steps = request.tasks[0].runtime.prepare
    assert isinstance(steps[0], RunStep) and isinstance(steps[1], CopyStep)
    assert steps[1].copy_ == "/a"


def test_num_sessions_counts_samples() -> None:
    request = parse_batch_request({"tasks": [task(num_samples=3), task(task_id="t2", num_samples=2)]})
    assert request.num_sessions == 5


@pytest.mark.parametrize(
    ("extra", "field", "words"),
    [
        ({"max_calls": 0}, "tasks[0].max_calls", "greater than or equal to 1"),
        ({"max_calls": "5"}, "tasks[0].max_calls", "integer"),
        ({"max_calls": 2.5}, "tasks[0].max_calls", "integer"),
        ({"max_concurrent_calls": 0}, "tasks[0].max_concurrent_calls", "greater than or equal to 1"),
        ({"max_concurrent_calls": True}, "tasks[0].max_concurrent_calls", "integer"),
    ],
)
def test_bad_call_limits_name_the_field(extra: dict[str, Any], field: str, words: str) -> None:
    with pytest.raises(ValidationError) as caught:
        parse_batch_request({"tasks": [task(**extra)]})
    assert caught.value.field == field and words in str(caught.value)


def test_call_limits_are_optional_and_may_come_from_the_defaults() -> None:
    request = parse_batch_request({"defaults": {"max_calls": 40}, "tasks": [task(), task(max_concurrent_calls=2)]})
    assert [(t.max_concurrent_calls, t.max_calls) for t in request.tasks] == [(None, 40), (2, 40)]
    assert parse_batch_request({"tasks": [task()]}).tasks[0].max_calls is None


def test_failure_reward_defaults_to_zero_and_takes_any_finite_number() -> None:
    parsed = parse_batch_request({"defaults": {"failure_reward": -1}, "tasks": [task(), task(failure_reward=0.5)]})
    assert [t.failure_reward for t in parsed.tasks] == [-1.0, 0.5]
    assert parse_batch_request({"tasks": [task()]}).tasks[0].failure_reward == 0.0
