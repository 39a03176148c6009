"""The TRL backend's pure parts: TRL's repeated prompts back to groups, and the dict rollout_func returns."""

from __future__ import annotations

import pytest

from polar.integrations.adapter import Group, Sample
from polar.integrations.trl import distinct_prompts, polar_reward, trl_output


def test_repeated_prompts_give_one_per_group() -> None:
    assert distinct_prompts(["a", "a", "b", "b"], 2) == ["a", "b"]
    assert distinct_prompts([[{"role": "user", "content": "x"}]] * 3, 3) == [[{"role": "user", "content": "x"}]]


@pytest.mark.parametrize(("prompts", "generations"), [(["a", "a", "b"], 2), (["a", "b", "a", "b"], 2), (["a"], 0)])
def test_prompts_that_are_not_whole_groups_are_refused(prompts: list[str], generations: int) -> None:
    with pytest.raises(ValueError):
        distinct_prompts(prompts, generations)


def _sample(session: str, reward: float | None) -> Sample:
    return Sample("t", 0, session, 1, [1, 2], [3, 4, 5], [-0.5, 0.0, -0.25], [1, 0, 1], reward, ["c"], 2, 1)


def test_the_output_is_aligned_with_the_samples_and_carries_polar_s_reward() -> None:
    output = trl_output([Group("t", [_sample("s1", 1.0), _sample("s2", 0.0)]), Group("u", [_sample("s3", None)])], 4)
    assert output["prompt_ids"] == [[1, 2]] * 3 and output["env_mask"] == [[1, 0, 1]] * 3
    assert output["polar_reward"] == [1.0, 0.0, None] and output["polar_session_id"] == ["s1", "s2", "s3"]
    assert output["polar_policy_version"] == [4, 4, 4]
    assert output["polar_left_out"] == [1, 1, 1]  # the side calls each sample's session made, not trained on
    assert output["polar_dropped_share"] == [0.0, 0.0, 0.0]  # no segment beside the main one
    assert polar_reward(["x", "y", "z"], polar_reward=output["polar_reward"]) == [1.0, 0.0, None]
    with pytest.raises(ValueError):
        polar_reward(["x"], polar_reward=[1.0, 0.0])
