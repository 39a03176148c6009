"""main_chain over constructed trajectories: prefix-merged token sequences (ChatML-like ids, as in
test_prefix_merging) and hand-written break records where a reason needs the messages to be told, segmented
without any call's text (``polar.reconstruction.segments``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from polar.reconstruction import CapturedCall, TrajectoryData, main_chain, per_request, prefix_merging
from polar.reconstruction.main_chain import answer_call, main_calls, marked
from polar.reconstruction.segments import segments

CONTINUES = ("compaction", "truncation", "tool_result_rewritten", "history_rewritten", "answer_rewritten",
             "reasoning_dropped", "retokenized", "tools_changed", "diverged", "shorter_prompt")  # fmt: skip

START, END, NL, SYSTEM, USER, ASSISTANT, TOOL = 1, 2, 3, 10, 11, 12, 13


def turn(role: int, *content: int) -> list[int]:
    return [START, role, NL, *content, END, NL]


CUE = [START, ASSISTANT, NL]
MAIN = turn(SYSTEM, 100, 101) + turn(USER, 110, 111)  # the harness's conversation
TITLE = turn(SYSTEM, 200) + turn(USER, 110, 111)  # "write a title for this": another system prompt
TOOL_OWN = turn(SYSTEM, 300) + turn(USER, 301)  # a tool command calling the proxy with the session's key


def call(seq: int, prompt: Sequence[int], completion: Sequence[int], agent: str | None = None) -> CapturedCall:
    return CapturedCall(f"c{seq}", seq, agent, list(prompt), list(completion), [-0.5] * len(completion), "stop")


def first_turns() -> tuple[CapturedCall, CapturedCall]:
    """The main chain's two calls: a tool call, then (after the tool's result) the answer."""
    first = call(1, MAIN + CUE, [120, 121, END])
    second = call(3, [*first.prompt_token_ids, 120, 121, END, NL, *turn(TOOL, 130), *CUE], [140, 141, END])
    return first, second


def chain(agent: str | None, tokens: int, calls: Sequence[str], *breaks: dict[str, Any]) -> TrajectoryData:
    return TrajectoryData(agent, [7] * tokens, [0] * tokens, [0.0] * tokens, list(calls), {"breaks": list(breaks)})


def broke(reason: str, nearest: int) -> dict[str, Any]:
    return {"reason": reason, "trajectory_index": nearest}


def main_flags(chains: Sequence[TrajectoryData]) -> list[bool]:
    """The main chain of ``chains`` as postrun marks it, their calls numbered by their ids ("c3": seq 3)."""
    calls = [call(int(c[1:]), [], []) for t in chains for c in t.call_ids]
    return main_chain.main_flags(segments(chains, calls, {}))


def test_a_side_call_made_last_is_not_the_main_chain_nor_its_answer() -> None:
    first, second = first_turns()
    title = call(4, TITLE + CUE, [150, END])
    calls = [first, second, title]
    chains = prefix_merging.reconstruct(calls)
    assert [(t.call_ids, t.stats["breaks"][0]["reason"] if t.stats["breaks"] else None) for t in chains] == [
        (["c1", "c3"], None),
        (["c4"], "new_conversation"),
    ]
    assert main_flags(chains) == [True, False]
    trajectories = marked(chains, main_calls(chains, main_flags(chains)))
    assert answer_call(calls, trajectories) == second  # not the title, though it came last


def test_a_tool_using_the_key_in_the_middle_is_not_the_main_chain() -> None:
    first, second = first_turns()
    tool_own = call(2, TOOL_OWN + CUE, [160, 161, 162, END])  # made while the tool ran, before the main chain went on
    calls = [first, tool_own, second]
    chains = prefix_merging.reconstruct(calls)
    assert [t.call_ids for t in chains] == [["c1", "c3"], ["c2"]]
    assert chains[1].stats["breaks"][0]["reason"] == "parallel"
    assert main_flags(chains) == [True, False]
    # Per request, each call is its own trajectory: marked by whether its call is in the merged main chain.
    trajectories = marked(per_request.reconstruct(calls), main_calls(chains, main_flags(chains)))
    assert [(t.call_ids, t.main) for t in trajectories] == [(["c1"], True), (["c2"], False), (["c3"], True)]
    assert answer_call(calls, trajectories) == second


def test_compaction_continues_the_main_chain_both_ways() -> None:
    # The conversation before compaction (0), the compacted one going on (1, longest), a title (2) against 1.
    chains = [chain(None, 50, ["c1", "c2"]), chain(None, 80, ["c3", "c5"], broke("compaction", 0)),
              chain(None, 9, ["c4"], broke("new_conversation", 1))]  # fmt: skip
    assert main_flags(chains) == [True, True, False]
    assert main_flags(chains[:2]) == [True, True]  # started at the longest (1), the chain it compacted is main too


def test_every_continuing_reason_joins_transitively_and_a_new_chain_does_not() -> None:
    for reason in sorted(CONTINUES):
        chains = [
            chain(None, 10, ["c1"]),
            chain(None, 30, ["c2"], broke(reason, 0)),
            chain(None, 5, ["c3"], broke("truncation", 1)),
            chain(None, 8, ["c4"], broke("parallel", 2)),
        ]
        assert main_flags(chains) == [True, True, True, False], reason


def test_another_agents_chain_is_not_main_however_long() -> None:
    chains = [chain("lead", 20, ["c1", "c3"]), chain("reviewer", 500, ["c2"]),
              chain("reviewer", 400, ["c4"], broke("compaction", 1))]  # fmt: skip
    assert main_flags(chains) == [True, False, False]


def test_the_main_chain_is_the_main_agents_longest_not_its_first_call() -> None:
    # A short side request made first (a quota probe) with the main agent's label; the conversation is the longer.
    chains = [chain(None, 4, ["c1"]), chain(None, 60, ["c2", "c3"], broke("new_conversation", 0))]
    assert main_flags(chains) == [False, True]
    assert main_flags([chain(None, 9, ["c1"]), chain(None, 9, ["c2"], broke("parallel", 0))]) == [True, False]


def test_no_trajectories_no_main_chain_and_no_answer() -> None:
    assert main_flags([]) == []
    assert answer_call([call(1, MAIN, [5])], []) is None
    unmarked = [chain(None, 3, ["c1"]), chain(None, 3, ["c2"])]  # stored before the mark: every one is main
    assert answer_call([call(1, MAIN, [5]), call(2, MAIN, [6])], unmarked) == call(2, MAIN, [6])
