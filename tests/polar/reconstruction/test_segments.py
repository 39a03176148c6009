"""Segments of a rollout (polar.reconstruction.segments) on sessions built from messages, rendered to tokens the way
a chat template does: compactions, spawned sub-agents, resamples, parallel calls, branches and side calls."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from polar.reconstruction import CapturedCall, TrajectoryData, prefix_merging
from polar.reconstruction.break_reasons import explain
from polar.reconstruction.main_chain import main_flags
from polar.reconstruction.segments import CallText, Segment, reused, segments

START, END, NL = 1, 2, 3
ROLES = {"system": 4, "user": 5, "assistant": 6, "tool": 7}


def _chars(text: str) -> list[int]:
    return [100 + ord(c) for c in text]


def _said(message: dict[str, Any]) -> str:
    calls = message.get("tool_calls") or []
    return (message.get("content") or "") + "".join(json.dumps(c["function"], sort_keys=True) for c in calls)


def render(messages: Sequence[dict[str, Any]]) -> list[int]:
    """The prompt a template renders: every message, then the assistant's cue."""
    tokens: list[int] = []
    for message in messages:
        tokens += [START, ROLES[message["role"]], *_chars(_said(message)), END, NL]
    return [*tokens, START, ROLES["assistant"]]


@dataclass
class Session:
    calls: list[CapturedCall] = field(default_factory=list)
    texts: dict[str, CallText] = field(default_factory=dict)
    forks: list[str] = field(default_factory=list)  # calls that branch at a call boundary
    compactions: dict[str, str] = field(default_factory=dict)  # continuation's first call -> summary call
    spawns: dict[str, tuple[str, str]] = field(default_factory=dict)  # child's first call -> (call, tool call id)
    sides: list[str] = field(default_factory=list)

    def ask(self, messages: list[dict[str, Any]], content: str, tool_calls: Sequence[dict[str, Any]] = ()) -> str:
        """One model call on ``messages``; returns its id."""
        seq = len(self.calls)
        call_id = f"c{seq}"
        answer = {"role": "assistant", "content": content, **({"tool_calls": list(tool_calls)} if tool_calls else {})}
        completion = [*_chars(_said(answer)), END]
        self.calls.append(CapturedCall(call_id, seq, None, render(messages), completion, [-0.5] * len(completion),
                                       "tool_calls" if tool_calls else "stop"))  # fmt: skip
        self.texts[call_id] = CallText([dict(m) for m in messages], answer)
        return call_id

    def answer(self, call_id: str) -> dict[str, Any]:
        return dict(self.texts[call_id].answer or {})


def step(session: Session, messages: list[dict[str, Any]], word: str) -> list[dict[str, Any]]:
    """A tool-using turn: the model answers, the tool's result follows."""
    seq = len(session.calls)
    call_id = session.ask(messages, f"answer-{seq:03d} {word}")
    return [*messages, session.answer(call_id), {"role": "tool", "content": f"result-{seq:03d} {word}"}]


OPENING = [{"role": "system", "content": "You are the main agent."}, {"role": "user", "content": "Task: fix it."}]


@st.composite
def sessions(draw: st.DrawFn) -> Session:
    session = Session()
    live = [step(session, list(OPENING), "first")]  # conversations that can go on
    snapshots = [list(OPENING)]  # prompts asked so far, for resamples
    for _ in range(draw(st.integers(1, 8))):
        op = draw(st.sampled_from(["step", "step", "resample", "parallel", "branch", "compact", "spawn", "side"]))
        word = draw(st.sampled_from(["alpha", "beta", "gamma"]))
        index = draw(st.integers(0, len(live) - 1))
        conversation = live[index]
        seq = len(session.calls)
        if op == "step":
            snapshots.append(conversation)
            live[index] = step(session, conversation, word)
        elif op in ("resample", "parallel"):
            prompt = draw(st.sampled_from(snapshots)) if op == "resample" else conversation
            if op == "parallel":
                live[index] = step(session, conversation, word)
            session.forks.append(f"c{len(session.calls)}")
            live.append(step(session, prompt, f"again {word}"))
        elif op == "branch":  # the same turn, another tool result after it
            cut = [i for i, m in enumerate(conversation) if m["role"] == "tool"][-1]
            session.forks.append(f"c{len(session.calls)}")
            other = [*conversation[:cut], {"role": "tool", "content": f"other-{seq:03d} {word}"}]
            live.append(step(session, other, word))
        elif op == "compact":
            told = f"summary-{seq:03d}: the work so far, told in enough words to be found again"
            summary = session.ask([*conversation, {"role": "user", "content": "Summarise the conversation."}], told)
            told = session.answer(summary)["content"]
            fresh = [OPENING[0], {"role": "user", "content": f"This session continues from before.\n{told}"}]
            if draw(st.booleans()):  # Codex keeps the task and adds the summary as another user message
                fresh = [*OPENING, {"role": "user", "content": told}]
            session.compactions[f"c{len(session.calls)}"] = summary
            live[index] = step(session, fresh, word)
        elif op == "spawn":
            task = f"sub-task {seq:03d}: look into the {word} module carefully"
            tool_call = {"id": f"toolu_{seq}", "type": "function",
                         "function": {"name": "Task", "arguments": json.dumps({"prompt": task})}}  # fmt: skip
            parent = session.ask(conversation, f"answer-{seq:03d} delegating", [tool_call])
            child = [{"role": "system", "content": "You are a sub-agent."}, {"role": "user", "content": task}]
            session.spawns[f"c{len(session.calls)}"] = (parent, f"toolu_{seq}")
            for turn in range(draw(st.integers(0, 2))):
                child = step(session, child, f"child {turn}")
            last = session.ask(child, f"child-final-{seq:03d}: the {word} module is fine")
            result = {"role": "tool", "tool_call_id": f"toolu_{seq}",
                      "content": f"Agent result:\n{session.answer(last)['content']}"}  # fmt: skip
            live[index] = step(session, [*conversation, session.answer(parent), result], word)
        else:
            call_id = session.ask([{"role": "system", "content": "Write a title."},
                                   {"role": "user", "content": "Task: fix it."}], f"title-{seq:03d}")  # fmt: skip
            session.sides.append(call_id)
    return session


def judged(session: Session) -> tuple[list[TrajectoryData], list[Segment]]:
    """Prefix-merged, breaks explained from the messages as postrun does (``polar.stages.breaks``), segmented."""
    trajectories = prefix_merging.reconstruct(session.calls)
    seqs = {call.call_id: call.seq for call in session.calls}
    explained = []
    for trajectory in trajectories:
        records = []
        for record in trajectory.stats["breaks"]:
            nearest = trajectories[record["trajectory_index"]]
            previous = [c for c in nearest.call_ids if seqs[c] < record["seq"]][-1]
            before = [*session.texts[previous].messages, session.texts[previous].answer]
            mask, position = nearest.loss_mask, record["position"]
            sampled = any(0 <= i < len(mask) and mask[i] == 1 for i in (position, position - 1))
            records.append(explain(record, before, session.texts[record["call_id"]].messages, sampled=sampled))
        explained.append(TrajectoryData(trajectory.agent, trajectory.token_ids, trajectory.loss_mask,
                                        trajectory.logprobs, trajectory.call_ids, {**trajectory.stats,
                                                                                   "breaks": records}))  # fmt: skip
    return explained, segments(explained, session.calls, session.texts)


@settings(max_examples=300, deadline=None)
@given(sessions())
def test_every_sampled_token_is_in_exactly_one_trainable_or_excluded_segment(session: Session) -> None:
    trajectories, found = judged(session)
    assert [s.index for s in found] == list(range(len(trajectories)))
    assert [s.edge for s in found].count(None) == 1  # one root
    assert all(s.edge != "unexplained" for s in found), [(s.edge, s.evidence) for s in found]
    owners: dict[tuple[str, int], int] = {}
    for trajectory, segment in zip(trajectories, found, strict=True):
        excluded = segment.edge == "side" or (segment.parent is not None and not found[segment.parent].trainable)
        assert segment.trainable == (not excluded)
        assert segment.parent is None or segment.parent < segment.index or segment.edge == "side"
        for call_id, (start, end) in zip(trajectory.call_ids, trajectory.stats["spans"], strict=True):
            assert trajectory.loss_mask[start:end] == [1] * (end - start)
            for position in range(end - start):
                assert (call_id, position) not in owners
                owners[(call_id, position)] = segment.index
    assert len(owners) == sum(len(call.completion_token_ids) for call in session.calls)
    first = {t.call_ids[0]: s for t, s in zip(trajectories, found, strict=True)}
    for call_id in session.forks:  # a fork at a call boundary is a fork, never diverged
        if call_id in first:
            assert first[call_id].edge == "fork", first[call_id]
    for call_id, summary in session.compactions.items():
        segment = first[call_id]
        assert segment.edge == "compaction" and segment.call_id == summary
        assert summary in trajectories[segment.parent].call_ids
    for call_id, (parent, tool_call_id) in session.spawns.items():
        segment = first[call_id]
        assert (segment.edge, segment.call_id, segment.tool_call_id) == ("spawn", parent, tool_call_id)
        assert segment.evidence["returned"] is True
    main = dict(zip((s.index for s in found), main_flags(found), strict=True))
    assert main[next(s.index for s in found if s.edge is None)]
    for segment in found:  # a sub-agent and a side call are off the main chain; a compaction of it is on it
        if segment.edge in ("spawn", "side"):
            assert not main[segment.index]
        elif segment.edge == "compaction" and main[segment.parent]:
            assert main[segment.index]
    for call_id in session.sides:  # the first title request is a side call; asked again, a fork of it
        if call_id in first:
            assert first[call_id].edge in ("side", "fork") and not first[call_id].trainable


def test_a_resample_of_the_first_call_is_a_fork_at_its_prompt() -> None:
    session = Session()
    step(session, list(OPENING), "one")
    step(session, list(OPENING), "two")
    trajectories, (root, fork) = judged(session)
    assert (root.edge, fork.edge, fork.parent, fork.call_id, fork.evidence["at"]) == (None, "fork", 0, "c0", "prompt")
    assert trajectories[1].stats["breaks"][0]["boundary"] == {"call_id": "c0", "at": "prompt"}


def test_a_title_request_first_is_a_side_call_and_the_conversation_is_the_root() -> None:
    session = Session()
    session.ask([{"role": "system", "content": "Write a title."}, {"role": "user", "content": "fix it"}], "Fixing")
    conversation = step(session, list(OPENING), "one")
    step(session, conversation, "two")
    _, (side, root) = judged(session)
    assert (side.edge, side.parent, side.trainable) == ("side", 1, False)
    assert (root.edge, root.parent, root.trainable) == (None, None, True)


def test_a_compacted_conversation_longer_than_before_keeps_the_first_as_root() -> None:
    session = Session()
    conversation = step(session, list(OPENING), "one")
    summary = session.ask([*conversation, {"role": "user", "content": "Summarise."}],
                          "summary: everything that happened so far, in enough words to find")  # fmt: skip
    fresh = [OPENING[0], {"role": "user", "content": "Continued.\n" + session.answer(summary)["content"]}]
    for word in ("a", "b", "c", "d"):
        fresh = step(session, fresh, word * 40)
    _, (root, compacted) = judged(session)
    assert root.edge is None
    assert (compacted.edge, compacted.parent, compacted.call_id) == ("compaction", 0, summary)


def test_an_unexplained_break_masks_the_sample_in_strict_and_not_in_lenient() -> None:
    session = Session()
    conversation = step(session, list(OPENING), "one")
    step(session, conversation, "two")
    # The same messages, but the model's own turn re-tokenised: nothing tells it from the messages alone here.
    call = session.calls[1]
    tokens = list(call.prompt_token_ids)
    tokens[len(session.calls[0].prompt_token_ids) + 1] += 1
    session.calls[1] = CapturedCall("c1", 1, None, tokens, call.completion_token_ids, call.logprobs, "stop")
    session.texts["c1"] = CallText(None, session.texts["c1"].answer)  # no bodies: unexplained
    trajectories = prefix_merging.reconstruct(session.calls)
    strict = segments(trajectories, session.calls, session.texts)
    lenient = segments(trajectories, session.calls, session.texts, "lenient")
    assert [s.edge for s in strict] == [None, "unexplained"]
    assert [s.trainable for s in strict] == [False, False] and "masked" in strict[0].evidence
    assert [s.trainable for s in lenient] == [True, True]


def test_reused_finds_a_reformatted_summary_and_not_a_short_echo() -> None:
    summary = "<summary>\n1. The user asked to fix the failing parser test.\n2. I changed parse() in lib.py.\n"
    told = "Summary:\n1. The user asked to fix the failing parser test.\n2. I changed parse() in lib.py."
    assert reused(summary, told) > 0
    assert reused("Done.", "Done. Anything else?") == 0
