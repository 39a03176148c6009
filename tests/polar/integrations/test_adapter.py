"""The adapter's pure parts: splitting a trajectory into TRL's prompt / completion / env_mask, and one sample per
session from the feed's items."""

from __future__ import annotations

import pytest

from polar.integrations.adapter import sample_of, split_trajectory


def test_a_trajectory_splits_at_the_first_sampled_token() -> None:
    # prompt 3 tokens, sampled 2, tool result 2 (mask 0), sampled 1
    prompt, completion, logprobs, env_mask = split_trajectory(
        [1, 2, 3, 4, 5, 6, 7, 8], [0, 0, 0, 1, 1, 0, 0, 1], [0, 0, 0, -0.5, -0.25, 0, 0, -1.0]
    )
    assert prompt == [1, 2, 3]
    assert completion == [4, 5, 6, 7, 8]
    assert logprobs == [-0.5, -0.25, 0.0, 0.0, -1.0]
    assert env_mask == [1, 1, 0, 0, 1]


def test_a_trajectory_of_unequal_parts_is_refused() -> None:
    with pytest.raises(ValueError, match="differ in length"):
        split_trajectory([1, 2, 3], [0, 1], [0.0, -1.0, -1.0])


def _item(session: str, mask: list[int], reward: float | None = 1.0) -> dict:
    return {"task_id": "t", "sample_index": 2, "session_id": session, "attempt": 2, "token_ids": list(range(len(mask))),
            "loss_mask": mask, "logprobs": [-0.1 * m for m in mask], "reward": reward, "call_ids": ["c1"]}  # fmt: skip


def test_a_session_with_several_trajectories_gives_the_one_with_most_sampled_tokens() -> None:
    sample = sample_of([_item("s", [0, 1]), _item("s", [0, 0, 1, 1, 0, 1])])
    assert (sample.task_id, sample.sample_index, sample.session_id, sample.attempt) == ("t", 2, "s", 2)
    assert sample.prompt_ids == [0, 1] and sample.env_mask == [1, 1, 0, 1]
    assert sample.trajectories == 2 and sample.reward == 1.0


def test_an_unscored_sample_keeps_its_missing_reward() -> None:
    assert sample_of([_item("s", [0, 1], reward=None)]).reward is None


def test_only_the_main_chain_is_trained_on_unless_every_chain_is_asked_for() -> None:
    main = {**_item("s", [0, 1, 1]), "main": True}
    side = {**_item("s", [0, 1, 1, 1, 1, 1]), "main": False, "call_ids": ["tool-own"]}  # more sampled tokens
    sample = sample_of([main, side])
    assert sample.completion_ids == [1, 2] and sample.call_ids == ["c1"]
    assert (sample.trajectories, sample.left_out) == (2, 1)
    every = sample_of([main, side], all_chains=True)
    assert every.call_ids == ["tool-own"] and every.left_out == 0
    # An item without the key (an older server) counts as main.
    assert sample_of([_item("s", [0, 1]), side]).call_ids == ["c1"]
    with pytest.raises(ValueError, match="none of its 1 trajectories is trainable"):
        sample_of([side])


def _segment(index: int, edge: str | None, trainable: bool = True, **evidence: str) -> dict:
    return {"index": index, "edge": edge, "parent": None if edge is None else 0, "call_id": None,
            "tool_call_id": None, "evidence": evidence, "trainable": trainable}  # fmt: skip


def test_every_trainable_segment_comes_with_the_root_as_the_sample_s_own_sequence() -> None:
    root = {**_item("s", [0, 1, 1]), "segment": _segment(0, None)}
    title = {**_item("s", [0, 1]), "segment": _segment(1, "side", trainable=False), "call_ids": ["t"]}
    compacted = {**_item("s", [0, 0, 1, 1, 1, 1, 0, 1]), "segment": _segment(2, "compaction"), "call_ids": ["c2"]}
    sample = sample_of([compacted, title, root])  # the feed's order is not the segments'
    assert sample.call_ids == ["c1"] and sample.env_mask == [1, 1]  # the root, though the compaction is longer
    assert [(s.index, s.edge, s.sampled_tokens) for s in sample.segments] == [(0, None, 2), (2, "compaction", 5)]
    assert (sample.trajectories, sample.left_out, sample.masked) == (3, 1, None)
    assert sample.dropped_share == 5 / 7


def test_a_strictly_masked_sample_has_no_segments_and_says_why() -> None:
    why = "strict: segment(s) [1] have no explained edge"
    root = {**_item("s", [0, 1]), "segment": _segment(0, None, trainable=False, masked=why)}
    odd = {**_item("s", [0, 0, 1]), "segment": _segment(1, "unexplained", trainable=False, masked=why)}
    sample = sample_of([root, odd])
    assert (sample.segments, sample.masked, sample.call_ids) == ((), why, ["c1"])
