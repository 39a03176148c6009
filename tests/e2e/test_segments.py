"""Segments end to end on the shared stack (gunicorn API and proxy, Celery stage workers, Postgres, the reference
engine): a harness that compacts its context the way Claude Code does (``tests/e2e/agents/compacting.py``) and one
that hands its work to a sub-agent through a ``Task`` tool call (``tests/e2e/agents/spawning.py``). Each session is
one rollout in two segments: the compacted conversation has a ``compaction`` edge to the segment whose sampled
summary it reuses, the sub-agent a ``spawn`` edge with the parent's tool call id, its last answer in the parent's
tool result. The segments are the same in the trajectories API, the feed, the RL export and the SQL view, and
``PolarRollouts`` gives both segments of each session under its one reward. One step of ``examples/grpo_cpu`` on
them (and on a one-segment session scored 0) counts each session once in its baseline."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from polar.integrations import PolarRollouts
from tests.e2e.agents.compacting import CONTINUED
from tests.e2e.agents.spawning import CHILD_SYSTEM
from tests.shared_stack import SCRIPTS
from tests.stacks import RunningStack

REPO = str(Path(__file__).resolve().parents[2])
SUMMARY = SCRIPTS["summary"]["turns"][0]["content"]
ANSWER = "The answer is 391."


def task(task_id: str, agent: str, answer: str = ANSWER) -> dict[str, Any]:
    return {
        "task_id": task_id,
        "instruction": "What is 17 * 23?",
        "timeout_seconds": 120,
        "reconstruction": "prefix_merging",
        "harness": {"name": "python", "command": f"tests.e2e.agents.{agent}:run", "env": {"PYTHONPATH": REPO}},
        "evaluator": {"name": "test_on_output", "config": {"answer": {"expected": answer}}},
    }


@pytest.fixture(scope="module")
def batch(shared_stack: RunningStack) -> dict[str, Any]:
    # A one-conversation session judged against another answer: scored 0, so the rewards differ.
    plain = {**task("plain", "spawning", "The answer is 400."), "harness": {"name": "python",
             "command": "polar.agents.calculator:run"}}  # fmt: skip
    tasks = [task("compacting", "compacting"), task("spawning", "spawning"), plain]
    batch_id = shared_stack.client.submit({"name": "segments", "tasks": tasks})["batch_id"]
    shared_stack.wait(batch_id, timeout_s=300)
    sessions = {s["task_id"]: s for s in shared_stack.client.sessions(batch_id)}
    for session in sessions.values():
        session["calls"] = shared_stack.client.calls(session["session_id"])
        session["trajectories"] = shared_stack.client.trajectories(session["session_id"])
    return {"batch_id": batch_id, "sessions": sessions}


def _edges(trajectories: list[dict[str, Any]]) -> list[tuple[int, str | None, int | None]]:
    return [(t["segment"]["index"], t["segment"]["edge"], t["segment"]["parent"]) for t in trajectories]


def _two_segment_sessions(batch: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in batch["sessions"].items() if k != "plain"}


def test_a_compaction_is_a_segment_with_an_edge_to_the_sampled_summary(batch: dict[str, Any]) -> None:
    session = batch["sessions"]["compacting"]
    assert (session["state"], session["reward"]) == ("completed", 1.0)
    calls = session["calls"]
    summary = next(c for c in calls if c["response"]["choices"][0]["message"].get("content") == SUMMARY)
    continued = next(c for c in calls if any(CONTINUED in str(m.get("content")) for m in c["request"]["messages"]))
    before, after = session["trajectories"]
    assert _edges([before, after]) == [(0, None, None), (1, "compaction", 0)]
    assert summary["call_id"] in before["call_ids"] and after["call_ids"][0] == continued["call_id"]
    assert after["segment"]["call_id"] == summary["call_id"]
    assert after["segment"]["evidence"]["summary_chars"] == len(SUMMARY)
    assert before["segment"]["trainable"] and after["segment"]["trainable"]


def test_a_sub_agent_is_a_spawned_segment_whose_answer_returns_to_the_parent(batch: dict[str, Any]) -> None:
    session = batch["sessions"]["spawning"]
    assert (session["state"], session["reward"]) == ("completed", 1.0)
    calls = {c["call_id"]: c for c in session["calls"]}
    parent, child = session["trajectories"]
    assert _edges([parent, child]) == [(0, None, None), (1, "spawn", 0)]
    assert calls[child["call_ids"][0]]["request"]["messages"][0]["content"] == CHILD_SYSTEM
    (task_call,) = calls[child["segment"]["call_id"]]["response"]["choices"][0]["message"]["tool_calls"]
    assert child["segment"]["tool_call_id"] == task_call["id"] and task_call["function"]["name"] == "Task"
    assert child["segment"]["evidence"]["returned"] is True
    child_answer = calls[child["call_ids"][-1]]["response"]["choices"][0]["message"]["content"]
    results = [m for m in calls[parent["call_ids"][-1]]["request"]["messages"] if m["role"] == "tool"]
    assert [(m["tool_call_id"], m["content"]) for m in results] == [(task_call["id"], child_answer)]


def test_the_feed_the_rl_export_and_the_view_carry_the_segments(
    shared_stack: RunningStack, batch: dict[str, Any], tmp_path: Path
) -> None:
    expected = {task_id: _edges(s["trajectories"]) for task_id, s in batch["sessions"].items()}
    assert expected["plain"] == [(0, None, None)]
    feed = shared_stack.client.feed(batch["batch_id"], groups=True)["items"]
    served: dict[str, list[tuple[int, str | None, int | None]]] = {}
    for item in feed:
        served.setdefault(item["task_id"], []).append(_edges([item])[0])
    assert served == expected
    shared_stack.client.download(batch["batch_id"], "rl", "jsonl", None, tmp_path / "rl.jsonl")
    exported: dict[str, list[tuple[int, str | None, int | None]]] = {}
    for line in (tmp_path / "rl.jsonl").read_text().splitlines():
        row = json.loads(line)
        exported.setdefault(row["task_id"], []).append(_edges([row])[0])
    assert exported == expected
    rows = shared_stack.sql("SELECT edge, parent, trainable, calls, sampled_tokens FROM trajectory_segments "
                            "WHERE batch_id = :b ORDER BY session_id, segment_index", b=batch["batch_id"])  # fmt: skip
    assert sorted(row.edge or "root" for row in rows) == ["compaction", "root", "root", "root", "spawn"]
    assert all(row.trainable and row.calls >= 1 and row.sampled_tokens > 0 for row in rows)


def test_polar_rollouts_give_every_segment_under_one_reward(shared_stack: RunningStack, batch: dict[str, Any]) -> None:
    found = PolarRollouts(shared_stack.client).collect(batch["batch_id"])
    for task_id, (sample,) in found.items():
        if task_id == "plain":
            assert [s.edge for s in sample.segments] == [None] and sample.dropped_share == 0.0
            continue
        session = batch["sessions"][task_id]
        assert [s.edge for s in sample.segments] == [None, {"compacting": "compaction"}.get(task_id, "spawn")]
        assert sample.call_ids == session["trajectories"][0]["call_ids"] and sample.reward == 1.0
        assert sample.masked is None and 0.0 < sample.dropped_share < 1.0
        assert sum(s.sampled_tokens for s in sample.segments) == sum(
            len(c["completion_token_ids"]) for c in session["calls"]
        )


def test_one_grpo_step_weighs_each_session_once(shared_stack: RunningStack, batch: dict[str, Any],
                                                tmp_path: Path) -> None:  # fmt: skip
    import torch

    from examples.grpo_cpu import train
    from polar.refengine.torch_model import new_model

    # The three sessions as one group: two of two segments scored 1, one of one segment scored 0.
    group = shared_stack.client.feed(batch["batch_id"], groups=True)["items"]
    rewards = {s["session_id"]: s["reward"] for s in batch["sessions"].values()}
    assert sorted(rewards.values()) == [0.0, 1.0, 1.0] and len(group) == 5
    figures: Counter = Counter()
    samples = train._samples(shared_stack.client.calls, group, figures)
    mean = sum(rewards.values()) / 3  # per session; per row it would be 4/5
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards.values()) / 3)
    assert len(samples) == 5 and figures["segments"] == 5 and figures["rewarded"] == 3
    for sample in samples:
        assert sample.advantage == pytest.approx((rewards[sample.session_id] - mean) / std)
    assert figures["mask_errors"] == 0  # each segment's mask is exactly its calls' sampled tokens
    model = new_model(seed=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    step = train.train_step(model, optimizer, shared_stack.client.calls, [group], train.Versions(), 0,
                            train.Options(out=tmp_path, epochs=1))  # fmt: skip
    assert (step["sessions"], step["trajectories"], step["masked_sessions"]) == (3, 5, 0)
    assert step["loss"] is not None and math.isfinite(step["loss"])
    # The loss is a mean over sessions, each a token mean over all its segments.
    per_token = [torch.ones(int(s.mask.sum())) * s.advantage for s in samples]
    by_session = train.session_losses(samples, per_token)
    assert sorted(by_session.tolist()) == pytest.approx(sorted((r - mean) / std for r in rewards.values()))
