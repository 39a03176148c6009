"""The real CLIs' compaction and sub-agents as segments, through the whole pipeline (the shared stack's
``plan_compaction`` and ``plan_subagent`` routes: ``polar harness check --compaction`` / ``--subagent`` scenarios).

Each CLI that compacts (``polar.local.harness_check.COMPACTION``: Claude Code, Codex, Gemini CLI, opencode, Qwen
Code) runs with its context made small enough that the plan's long steps reach its compaction (Gemini CLI with a hook
that asks it once to go on); its session must compact at least once, with a ``compaction`` edge to the segment whose
sampled summary it reuses. Claude Code and opencode hand step 1 to their sub-agent tool (``SUBAGENT``): a ``spawn``
edge with the parent's tool call id, and the child's last answer in the parent's tool result. No edge in any of these
sessions is ``unexplained``. All in one batch.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from polar.harnesses.install import install
from polar.local.harness_check import COMPACTION, SUBAGENT, check_task
from tests.e2e.file_task import wait_finished
from tests.shared_stack import routed
from tests.stacks import RunningStack

pytestmark = [pytest.mark.long(seconds=60), pytest.mark.timeout(1500)]

RUNS = [*(("compaction", cli) for cli in COMPACTION), *(("subagent", cli) for cli in SUBAGENT)]


@pytest.fixture(scope="module")
def sessions(shared_stack: RunningStack) -> dict[tuple[str, str], dict[str, Any]]:
    install(sorted({cli for _, cli in RUNS}))
    tasks = []
    for kind, cli in RUNS:
        scenario = (COMPACTION if kind == "compaction" else SUBAGENT)[cli]
        task = check_task(cli, scenario.turns, False, scenario=scenario)
        route = "plan_compaction" if kind == "compaction" else "plan_subagent"
        tasks.append({**task, "task_id": f"{kind}-{cli}", "instruction": routed(route, task["instruction"]),
                      "timeout_seconds": 600})  # fmt: skip
    submitted = shared_stack.client.submit({"name": "harness-segments", "tasks": tasks})
    wait_finished(shared_stack, submitted["batch_id"], timeout_s=1200)
    found = {}
    for session in shared_stack.client.sessions(submitted["batch_id"]):
        kind, cli = session["task_id"].split("-", 1)
        session["calls"] = {c["call_id"]: c for c in shared_stack.client.calls(session["session_id"])}
        session["trajectories"] = shared_stack.client.trajectories(session["session_id"])
        found[(kind, cli)] = session
    for (kind, cli), session in sorted(found.items()):
        edges = [(t["segment"]["edge"], t["segment"]["parent"], len(t["call_ids"])) for t in session["trajectories"]]
        print(f"{kind:10} {cli:12} {session['state']:10} {len(session['calls']):3} calls  {edges}")
    return found


def _answer(call: dict[str, Any]) -> str:
    return str(call["response"]["choices"][0]["message"].get("content") or "").strip()


def _segments(session: dict[str, Any]) -> list[dict[str, Any]]:
    return [t["segment"] for t in session["trajectories"]]


@pytest.mark.parametrize("cli", list(COMPACTION))
def test_a_compacting_cli_has_a_compaction_edge_to_its_summary(
    cli: str, sessions: dict[tuple[str, str], dict[str, Any]]
) -> None:
    session = sessions[("compaction", cli)]
    assert session["state"] == "completed", session.get("error")
    segments = _segments(session)
    assert [s["edge"] for s in segments if s["edge"] == "unexplained"] == [], segments
    compactions = [s for s in segments if s["edge"] == "compaction"]
    assert compactions, [s["edge"] for s in segments]
    by_call = {c: t for t in session["trajectories"] for c in t["call_ids"]}
    for segment in compactions:
        summary = session["calls"][segment["call_id"]]  # the call whose sampled text the compacted prompt reuses
        assert by_call[summary["call_id"]]["segment"]["index"] == segment["parent"]
    # At least one compaction reuses the summary the plan answered the CLI's summary request with.
    told = [_answer(session["calls"][s["call_id"]]) for s in compactions]
    assert any("[plan: " in text for text in told), told


@pytest.mark.parametrize("cli", list(SUBAGENT))
def test_a_sub_agent_is_a_spawn_edge_whose_answer_returns(
    cli: str, sessions: dict[tuple[str, str], dict[str, Any]]
) -> None:
    session = sessions[("subagent", cli)]
    assert session["state"] == "completed", session.get("error")
    segments = _segments(session)
    assert [s["edge"] for s in segments if s["edge"] == "unexplained"] == [], segments
    (spawn,) = [s for s in segments if s["edge"] == "spawn"]
    calls = session["calls"]
    tool_calls = calls[spawn["call_id"]]["response"]["choices"][0]["message"]["tool_calls"]
    assert spawn["tool_call_id"] in [t["id"] for t in tool_calls]
    assert spawn["evidence"]["returned"] is True
    child = next(t for t in session["trajectories"] if t["segment"]["index"] == spawn["index"])
    answer = _answer(calls[child["call_ids"][-1]])
    parent = next(t for t in session["trajectories"] if t["segment"]["index"] == spawn["parent"])
    # The parent's next request, in the CLI's own protocol, carries it back (as the tool call's result).
    later = [json.dumps(calls[c]["request"]) for c in parent["call_ids"]
             if calls[c]["seq"] > calls[child["call_ids"][-1]]["seq"]]  # fmt: skip
    assert later and all(answer in text for text in later), answer
