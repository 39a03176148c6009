"""Properties shared by the reconstructions, on random sessions: calls that extend earlier calls, cut them back,
start afresh, or belong to another agent — over a tiny token alphabet, so accidental prefixes are common."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from polar.reconstruction import CapturedCall, TrajectoryData, per_request, prefix_merging

TOKENS = st.lists(st.integers(0, 3), max_size=6)
LOGPROBS = st.floats(min_value=-20.0, max_value=0.0, allow_nan=False)


@st.composite
def sessions(draw: st.DrawFn) -> list[CapturedCall]:
    calls: list[CapturedCall] = []
    for seq in range(draw(st.integers(0, 12))):
        agent = draw(st.sampled_from(["main", "sub", None]))
        kind = draw(st.sampled_from(["extend", "extend", "extend", "cut", "fresh"]))
        if calls and kind != "fresh":
            earlier = draw(st.sampled_from(calls))
            base = [*earlier.prompt_token_ids, *earlier.completion_token_ids]
            if kind == "cut":
                base = base[: draw(st.integers(0, len(base)))]
            prompt = base + draw(TOKENS)
        else:
            prompt = draw(TOKENS)
        completion = draw(TOKENS)
        logprobs = draw(st.lists(LOGPROBS, min_size=len(completion), max_size=len(completion)))
        reason = draw(st.sampled_from(["stop", "length", "tool_calls", None]))
        calls.append(CapturedCall(f"c{seq}", seq, agent, prompt, completion, logprobs, reason))
    return draw(st.permutations(calls))


def _trained(trajectories: Sequence[TrajectoryData], calls: Sequence[CapturedCall]) -> Counter[tuple[str, int, float]]:
    """(call_id, token, logprob) at every mask-1 position, attributing positions to the calls in order."""
    by_id = {call.call_id: call for call in calls}
    covered: Counter[tuple[str, int, float]] = Counter()
    for trajectory in trajectories:
        owners = [cid for cid in trajectory.call_ids for _ in by_id[cid].completion_token_ids]
        trained = [i for i, mask in enumerate(trajectory.loss_mask) if mask == 1]
        assert len(owners) == len(trained)
        for owner, position in zip(owners, trained, strict=True):
            covered[(owner, trajectory.token_ids[position], trajectory.logprobs[position])] += 1
    return covered


def _check_shape(trajectories: Sequence[TrajectoryData], calls: Sequence[CapturedCall]) -> None:
    assert sorted(cid for t in trajectories for cid in t.call_ids) == sorted(call.call_id for call in calls)
    for trajectory in trajectories:
        assert len(trajectory.token_ids) == len(trajectory.loss_mask) == len(trajectory.logprobs)
        assert set(trajectory.loss_mask) <= {0, 1}
        assert all(lp == 0.0 for lp, mask in zip(trajectory.logprobs, trajectory.loss_mask, strict=True) if not mask)


@settings(max_examples=300, deadline=None)
@given(sessions())
def test_both_reconstructions_train_exactly_the_sampled_tokens(calls: list[CapturedCall]) -> None:
    expected = Counter(
        (call.call_id, token, logprob)
        for call in calls
        for token, logprob in zip(call.completion_token_ids, call.logprobs, strict=True)
    )
    for reconstruct in (per_request.reconstruct, prefix_merging.reconstruct):
        trajectories = reconstruct(calls)
        _check_shape(trajectories, calls)
        assert _trained(trajectories, calls) == expected


@settings(max_examples=300, deadline=None)
@given(sessions())
def test_prefix_merging_chains_calls_exactly(calls: list[CapturedCall]) -> None:
    by_id = {call.call_id: call for call in calls}
    trajectories = prefix_merging.reconstruct(calls)
    for trajectory in trajectories:
        members = [by_id[cid] for cid in trajectory.call_ids]
        assert [call.seq for call in members] == sorted(call.seq for call in members)
        assert {call.agent for call in members} == {trajectory.agent}
        for call in members:  # each call's prompt and sampled ids sit verbatim at the start of its trajectory
            full = [*call.prompt_token_ids, *call.completion_token_ids]
            assert trajectory.token_ids[: len(full)] == full
            assert trajectory.loss_mask[len(call.prompt_token_ids) : len(full)] == [1] * len(call.completion_token_ids)
        assert trajectory.token_ids == full  # the last call ends the trajectory
        assert trajectory.stats["num_calls"] == len(members)
        assert trajectory.stats["completion_tokens"] == sum(trajectory.loss_mask)
        assert trajectory.stats["prompt_tokens"] == len(trajectory.loss_mask) - sum(trajectory.loss_mask)
        assert trajectory.stats["finish_reasons"] == [call.finish_reason for call in members]
        assert trajectory.stats["num_breaks"] == len(trajectory.stats["breaks"]) <= 1


@settings(max_examples=300, deadline=None)
@given(sessions())
def test_every_new_trajectory_after_an_agents_first_is_an_explained_break(calls: list[CapturedCall]) -> None:
    by_id = {call.call_id: call for call in calls}
    trajectories = prefix_merging.reconstruct(calls)
    for agent in {call.agent for call in calls}:
        own = [t for t in trajectories if t.agent == agent]
        assert len(own) == 1 + sum(t.stats["num_breaks"] for t in own)
        assert own[0].stats["breaks"] == []
    for trajectory in trajectories:
        for record in trajectory.stats["breaks"]:
            assert record["call_id"] == trajectory.call_ids[0]
            prompt = list(by_id[record["call_id"]].prompt_token_ids)
            nearest = trajectories[record["trajectory_index"]]
            position = record["position"]
            assert record["reason"] in {"parallel", "new_conversation", "shorter_prompt", "diverged"}
            assert (record["agent"], record["seq"]) == (trajectory.agent, by_id[record["call_id"]].seq)
            assert nearest.agent == trajectory.agent
            assert by_id[nearest.call_ids[0]].seq < record["seq"]
            assert prompt[:position] == nearest.token_ids[:position]
            assert record["expected_token"] == nearest.token_ids[position]
            assert record["actual_token"] == (prompt[position] if position < len(prompt) else None)
            assert record["actual_token"] != record["expected_token"]
