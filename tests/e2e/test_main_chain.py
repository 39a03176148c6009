"""The main chain end to end: a harness whose tool command calls the model with the session's key, and whose last
call is a title request on another system prompt (``tests/e2e/agents/side_calls.py``), through the gunicorn-served
API and proxy, the Celery stage workers, Postgres and the reference engine (the calculator's turns from the
``arithmetic`` policy, the title from a scripted one). One batch: the same harness reconstructed by prefix merging
and per request.

The answer is judged on the main chain (an ``answer`` evaluator on ``last_message``), the SFT row is the main chain,
and the tool's and the title's calls are ``main: false`` in the session's trajectories, the feed and the RL export,
and never in ``PolarRollouts``' samples.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from polar.integrations import PolarRollouts
from tests.e2e.agents.side_calls import TITLE_SYSTEM, TOOL_SYSTEM
from tests.shared_stack import SCRIPTS
from tests.stacks import RunningStack

REPO = str(Path(__file__).resolve().parents[2])
# The shared stack's engine answers the title request (its "short title" system prompt) from the "title" script, more
# sampled tokens than the main chain's; the calculator's turns from the arithmetic policy.
TITLE = SCRIPTS["title"]["turns"][0]["content"]
ANSWER = "The answer is 391."


def side_calls_task(task_id: str, reconstruction: str) -> dict[str, Any]:
    return {
        "task_id": task_id,
        "instruction": "What is 17 * 23?",
        "timeout_seconds": 120,
        "reconstruction": reconstruction,
        "harness": {"name": "python", "command": "tests.e2e.agents.side_calls:run", "env": {"PYTHONPATH": REPO}},
        "evaluator": {"name": "test_on_output", "config": {"answer": {"expected": ANSWER}}},
    }


@pytest.fixture(scope="module")
def stack(shared_stack: RunningStack) -> RunningStack:
    return shared_stack  # the harness is named by import path: tests.e2e is a plugin module there


@pytest.fixture(scope="module")
def batch(stack: RunningStack) -> dict[str, Any]:
    """The batch, finished: its id and its sessions by task id, each with its calls told apart by system prompt."""
    tasks = [side_calls_task("merged", "prefix_merging"), side_calls_task("per-call", "per_request")]
    batch_id = stack.client.submit({"name": "main-chain", "tasks": tasks})["batch_id"]
    stack.wait(batch_id, timeout_s=300)
    sessions = {s["task_id"]: s for s in stack.client.sessions(batch_id)}
    for session in sessions.values():
        (row,) = stack.sql("SELECT evaluation FROM sessions WHERE id = :id", id=session["session_id"])
        session["evaluation"] = row.evaluation
        calls = stack.client.calls(session["session_id"])
        session["roles"] = {c["call_id"]: _role(c) for c in calls}
    return {"batch_id": batch_id, "sessions": sessions}


def _role(call: dict[str, Any]) -> str:
    system = call["request"]["messages"][0]["content"]
    return {TITLE_SYSTEM: "title", TOOL_SYSTEM: "tool"}.get(system, "main")


def _roles(session: dict[str, Any], call_ids: list[str]) -> list[str]:
    return [session["roles"][call_id] for call_id in call_ids]


def test_the_answer_is_judged_on_the_main_chain_not_the_title_made_last(batch: dict[str, Any]) -> None:
    for task_id, session in batch["sessions"].items():
        assert (session["state"], session["reward"]) == ("completed", 1.0), (task_id, session["evaluation"])
        assert session["evaluation"]["answer"]["found"] == ANSWER
        assert list(session["roles"].values()) == ["main", "tool", "main", "title"]  # the order they were made


def test_side_calls_are_marked_in_the_trajectories_the_feed_and_the_rl_export(
    stack: RunningStack, batch: dict[str, Any], tmp_path: Path
) -> None:
    sessions = batch["sessions"]
    expected = {
        "merged": [(["main", "main"], True), (["tool"], False), (["title"], False)],
        "per-call": [(["main"], True), (["tool"], False), (["main"], True), (["title"], False)],
    }
    for task_id, session in sessions.items():
        served = stack.client.trajectories(session["session_id"])
        assert [(_roles(session, t["call_ids"]), t["main"]) for t in served] == expected[task_id]
    feed = stack.client.feed(batch["batch_id"], groups=True)["items"]
    by_task: dict[str, list[tuple[list[str], bool]]] = {}
    for item in feed:
        session = sessions[item["task_id"]]
        by_task.setdefault(item["task_id"], []).append((_roles(session, item["call_ids"]), item["main"]))
    assert by_task == expected
    stack.client.download(batch["batch_id"], "rl", "jsonl", None, tmp_path / "rl.jsonl")
    rows = [json.loads(line) for line in (tmp_path / "rl.jsonl").read_text().splitlines()]
    exported: dict[str, list[bool]] = {}
    for row in rows:
        exported.setdefault(row["task_id"], []).append(row["main"])
    assert exported == {task_id: [main for _, main in chains] for task_id, chains in expected.items()}


def test_the_sft_row_is_the_main_chain(stack: RunningStack, batch: dict[str, Any], tmp_path: Path) -> None:
    stack.client.download(batch["batch_id"], "sft", "jsonl", None, tmp_path / "sft.jsonl")
    rows = [json.loads(line) for line in (tmp_path / "sft.jsonl").read_text().splitlines()]
    assert len(rows) == 2
    for row in rows:
        assert [m["role"] for m in row["messages"]] == ["system", "user", "assistant", "tool", "assistant"]
        assert row["messages"][0]["content"] != TITLE_SYSTEM and row["messages"][-1]["content"].strip() == ANSWER


def test_polar_rollouts_train_on_the_main_chain_only(stack: RunningStack, batch: dict[str, Any]) -> None:
    sessions = {s["session_id"]: s for s in batch["sessions"].values()}
    found = PolarRollouts(stack.client).collect(batch["batch_id"])
    samples = [sample for task in found.values() for sample in task]
    assert len(samples) == 2
    for sample in samples:
        session = sessions[sample.session_id]
        assert set(_roles(session, sample.call_ids)) == {"main"} and sample.left_out == 2
        assert sample.reward == 1.0
    # Asked for every chain, every trajectory is a segment to train; the sample's own sequence is still the root's.
    every = PolarRollouts(stack.client, all_chains=True).collect(batch["batch_id"])
    for task in every.values():
        (sample,) = task
        assert set(_roles(sessions[sample.session_id], sample.call_ids)) == {"main"} and sample.left_out == 0
        assert len(sample.segments) == sample.trajectories
