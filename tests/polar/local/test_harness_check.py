from __future__ import annotations

from typing import Any

from polar.local.harness_check import COMPACTION, build_report, check_task, render


def calls(n: int) -> list[dict[str, Any]]:
    return [{"call_id": f"c{i}", "seq": i + 1, "agent": None, "status_code": 200, "delivered": True} for i in range(n)]


def brk(call_id: str, seq: int, reason: str, index: int = 0) -> dict[str, Any]:
    return {"call_id": call_id, "seq": seq, "reason": reason, "position": 40, "expected_token": 7,
            "actual_token": 9, "trajectory_index": index, "detail": "why"}  # fmt: skip


SESSION = {"session_id": "s1", "state": "completed"}


def test_merge_rate_counts_continuations_not_new_conversations() -> None:
    trajectories = [
        {"agent": None, "call_ids": ["c0", "c1", "c3", "c4"], "stats": {"breaks": []}},
        {"agent": None, "call_ids": ["c2"], "stats": {"breaks": [brk("c2", 3, "new_conversation")]}},
        {"agent": None, "call_ids": ["c5"], "stats": {"breaks": [brk("c5", 6, "reasoning_dropped")]}},
    ]
    report = build_report(SESSION, calls(7), trajectories, lambda token: f"<{token}>")
    main = report.main_chain
    assert main is not None and (main.calls, main.continued) == (4, 4)  # 3 extended + 1 reasoning_dropped break
    assert main.merge_rate == 0.75 and report.merge_rate == 0.75
    assert report.ok and dict(report.breaks) == {"new_conversation": 1, "reasoning_dropped": 1}
    text = render(report)
    assert "merge rate 75% overall, 75% on the main chain (4 calls)" in text
    assert "opened: reasoning_dropped at token 40 of chain 0 (expected '<7>', got '<9>'); why" in text
    assert "   7  -             200      -  not in a trajectory" in text


def test_an_unexplained_break_fails_the_check() -> None:
    trajectories = [
        {"agent": "main", "call_ids": ["c0"], "stats": {"breaks": []}},
        {"agent": "main", "call_ids": ["c1"], "stats": {"breaks": [brk("c1", 2, "diverged")]}},
    ]
    report = build_report(SESSION, calls(2), trajectories, str)
    assert not report.ok and [line.seq for line in report.unexplained] == [2]
    assert "UNEXPLAINED at seq 2" in render(report)


def _segment(index: int, edge: str | None, parent: int | None, **evidence: Any) -> dict[str, Any]:
    return {"index": index, "edge": edge, "parent": parent, "call_id": None, "tool_call_id": None,
            "evidence": evidence, "trainable": edge != "side"}  # fmt: skip


def test_segments_decide_the_check_and_its_json_line() -> None:
    trajectories = [
        {"agent": "main", "call_ids": ["c0"], "loss_mask": [0, 1], "stats": {"breaks": [], "completion_tokens": 1},
         "segment": _segment(0, None, None)},
        {"agent": "main", "call_ids": ["c1"], "loss_mask": [0, 1, 1],
         "segment": _segment(1, "compaction", 0, summary_chars=80),
         "stats": {"breaks": [brk("c1", 2, "diverged")], "completion_tokens": 2}},
    ]  # fmt: skip
    report = build_report(SESSION, calls(2), trajectories, str)
    assert report.ok and report.unexplained == []  # the break is told by its compaction edge
    line = report.as_json("claude_code")
    assert (line["harness"], line["session_id"], line["unexplained"]) == ("claude_code", SESSION["session_id"], 0)
    assert [(s["index"], s["edge"], s["parent"], s["calls"], s["sampled_tokens"]) for s in line["segments"]] == [
        (0, None, None, 1, 1), (1, "compaction", 0, 1, 2)]  # fmt: skip
    assert "compaction        0      1        2  summary_chars=80" in render(report)
    trajectories[1]["segment"] = _segment(1, "unexplained", 0)
    odd = build_report(SESSION, calls(2), trajectories, str)
    assert not odd.ok and odd.as_json("x")["unexplained"] == 1 and [line.seq for line in odd.unexplained] == [2]


def test_a_session_that_did_not_complete_fails_the_check() -> None:
    # e.g. a command harness whose program is missing: no calls, so no break, and nothing was checked
    failed = {"session_id": "s2", "state": "failed", "error": "harness exited with code 2"}
    report = build_report(failed, [], [], str)
    assert not report.unexplained and not report.ok
    assert "NOT CHECKED: the session ended failed (harness exited with code 2); see its logs" in render(report)


def test_undelivered_calls_are_said_so() -> None:
    undelivered = [{**calls(1)[0], "delivered": False}]
    assert "undelivered: the harness never saw it" in render(build_report(SESSION, undelivered, [], str))


def test_the_task() -> None:
    task = check_task("pi", 30, tito=True, runtime="bwrap")
    assert task["harness"] == {"name": "pi"} and task["token_in_token_out"] is True
    assert task["reconstruction"] == "prefix_merging" and task["runtime"] == {"backend": "bwrap"}
    compacting = check_task("claude_code", 14, tito=False, scenario=COMPACTION["claude_code"])
    assert compacting["harness"]["env"]["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] == "38000"
    own = check_task("command", 5, tito=False, command="my-agent {instruction}")
    assert own["harness"] == {"name": "command", "command": "my-agent {instruction}"} and "runtime" not in own
