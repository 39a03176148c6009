"""prefix_merging on hand-built token sequences.

Token ids stand for a ChatML-like template: ``START`` = ``<|im_start|>``, ``END`` = ``<|im_end|>``, ``NL`` = ``\\n``,
role tokens, and content tokens from 100 upwards.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from polar.reconstruction import RECONSTRUCTIONS, CapturedCall
from polar.reconstruction.prefix_merging import reconstruct

START, END, NL, SYSTEM, USER, ASSISTANT, TOOL = 1, 2, 3, 10, 11, 12, 13


def turn(role: int, *content: int) -> list[int]:
    return [START, role, NL, *content, END, NL]


def cue() -> list[int]:
    return [START, ASSISTANT, NL]


def call(
    seq: int,
    prompt: Sequence[int],
    completion: Sequence[int],
    *,
    agent: str | None = "main",
    finish_reason: str | None = "stop",
) -> CapturedCall:
    logprobs = [-(seq + 1) - index / 100 for index in range(len(completion))]
    return CapturedCall(f"c{seq}", seq, agent, list(prompt), list(completion), logprobs, finish_reason)


OPENING = turn(SYSTEM, 100, 101) + turn(USER, 110, 111)


def test_registered() -> None:
    assert RECONSTRUCTIONS["prefix_merging"] is reconstruct


def test_three_turn_chain_is_one_trajectory() -> None:
    p0 = OPENING + cue()
    s0 = [200, 201, END]
    p1 = p0 + s0 + [NL] + turn(USER, 120) + cue()
    s1 = [210, END]
    p2 = p1 + s1 + [NL] + turn(USER, 130, 131) + cue()
    s2 = [220, 221, 222, END]
    calls = [call(0, p0, s0), call(1, p1, s1), call(2, p2, s2)]

    [trajectory] = reconstruct(calls)

    assert trajectory.token_ids == p2 + s2
    between_1 = [NL, *turn(USER, 120), *cue()]
    between_2 = [NL, *turn(USER, 130, 131), *cue()]
    assert trajectory.loss_mask == (
        [0] * len(p0) + [1, 1, 1] + [0] * len(between_1) + [1, 1] + [0] * len(between_2) + [1, 1, 1, 1]
    )
    assert trajectory.logprobs == (
        [0.0] * len(p0)
        + list(calls[0].logprobs)
        + [0.0] * len(between_1)
        + list(calls[1].logprobs)
        + [0.0] * len(between_2)
        + list(calls[2].logprobs)
    )
    assert trajectory.call_ids == ["c0", "c1", "c2"]
    assert trajectory.agent == "main"
    assert trajectory.stats == {
        "num_calls": 3,
        "prompt_tokens": len(p0) + len(between_1) + len(between_2),
        "completion_tokens": 9,
        "finish_reasons": ["stop", "stop", "stop"],
        "spans": [[len(p0), len(p0) + 3], [len(p1), len(p1) + 2], [len(p2), len(p2) + 4]],
        "num_breaks": 0,
        "breaks": [],
        "policy_versions": [],  # calls stamped with no policy version
    }


def test_tool_results_are_masked_interstitials() -> None:
    p0 = OPENING + cue()
    s0 = [300, 301, 302, END]  # a tool call
    result = [NL, *turn(TOOL, 400, 401, 402, 403), *cue()]
    p1 = p0 + s0 + result
    s1 = [310, END]
    [trajectory] = reconstruct([call(0, p0, s0, finish_reason="tool_calls"), call(1, p1, s1)])

    start = len(p0) + len(s0)
    assert trajectory.token_ids[start : start + len(result)] == result
    assert trajectory.loss_mask[start : start + len(result)] == [0] * len(result)
    assert trajectory.logprobs[start : start + len(result)] == [0.0] * len(result)
    assert trajectory.loss_mask[-2:] == [1, 1]
    assert trajectory.stats["finish_reasons"] == ["tool_calls", "stop"]


def test_turn_truncated_by_length_still_merges_and_its_closing_token_is_not_trained() -> None:
    p0 = OPENING + cue()
    s0 = [200, 201, 202]  # cut by max_tokens: no END sampled
    p1 = p0 + s0 + [END, NL] + turn(USER, 120) + cue()  # the template closes the turn anyway
    s1 = [210, END]
    [trajectory] = reconstruct([call(0, p0, s0, finish_reason="length"), call(1, p1, s1)])

    assert trajectory.token_ids == p1 + s1
    closing = len(p0) + len(s0)
    assert trajectory.token_ids[closing] == END
    assert trajectory.loss_mask[closing] == 0
    assert trajectory.logprobs[closing] == 0.0
    assert trajectory.loss_mask[closing - 3 : closing] == [1, 1, 1]
    assert trajectory.stats["finish_reasons"] == ["length", "stop"]
    assert trajectory.stats["num_breaks"] == 0


def test_prompt_equal_to_trajectory_extends_it_without_interstitials() -> None:
    p0 = OPENING + cue()
    s0 = [200, 201]
    s1 = [202, END]
    [trajectory] = reconstruct([call(0, p0, s0, finish_reason="length"), call(1, p0 + s0, s1)])
    assert trajectory.token_ids == p0 + s0 + s1
    assert trajectory.loss_mask == [0] * len(p0) + [1, 1, 1, 1]


def test_parallel_sub_agent_sharing_the_system_prompt() -> None:
    system = turn(SYSTEM, 100, 101)
    main0 = system + turn(USER, 110) + cue()
    main_s0 = [200, END]
    sub0 = system + turn(USER, 500, 501) + cue()
    sub_s0 = [600, END]
    main1 = main0 + main_s0 + [NL] + turn(TOOL, 410) + cue()
    main_s1 = [210, END]
    sub1 = sub0 + sub_s0 + [NL] + turn(TOOL, 420) + cue()
    sub_s1 = [610, END]
    calls = [call(0, main0, main_s0), call(1, sub0, sub_s0), call(2, main1, main_s1), call(3, sub1, sub_s1)]

    main, sub = reconstruct(calls)

    assert main.call_ids == ["c0", "c2"] and sub.call_ids == ["c1", "c3"]
    assert main.token_ids == main1 + main_s1
    assert sub.token_ids == sub1 + sub_s1
    assert main.stats["breaks"] == []
    position = len(system) + 3  # START USER NL, then the first user content token differs
    assert sub.stats["num_breaks"] == 1
    assert sub.stats["breaks"] == [
        {
            "call_id": "c1",
            "seq": 1,
            "agent": "main",
            "reason": "parallel",
            "position": position,
            "expected_token": 110,
            "actual_token": 500,
            "trajectory_index": 0,
            "boundary": None,
        }
    ]


def test_compaction_right_after_the_task_looks_like_a_new_conversation_to_tokens_alone() -> None:
    # The summary replaces everything after the task, inside the chain's first prompt: tokens cannot tell this from
    # a new conversation; break_reasons.explain tells it from the messages (tests/polar/reconstruction).
    p0 = OPENING + cue()
    s0 = [200, 201, END]
    p1 = p0 + s0 + [NL] + turn(TOOL, 400, 401, 402, 403, 404) + cue()
    s1 = [210, END]
    compacted = OPENING + turn(USER, 900) + cue()  # a summary replaces the history after the task
    s2 = [220, END]
    first, second = reconstruct([call(0, p0, s0), call(1, p1, s1), call(2, compacted, s2)])

    assert first.call_ids == ["c0", "c1"] and second.call_ids == ["c2"]
    assert second.token_ids == compacted + s2
    assert second.stats["breaks"] == [
        {
            "call_id": "c2",
            "seq": 2,
            "agent": "main",
            "reason": "new_conversation",
            "position": len(OPENING) + 1,  # both open a turn: assistant cue vs user role
            "expected_token": ASSISTANT,
            "actual_token": USER,
            "trajectory_index": 0,
            "boundary": None,
        }
    ]


def test_template_dropping_reasoning_diverges_at_the_first_rewritten_token() -> None:
    think, end_think = 50, 51
    p0 = OPENING + cue()
    s0 = [think, 250, 251, end_think, 200, END]
    p1 = [*p0, 200, END, NL, *turn(TOOL, *range(400, 420)), *cue()]  # reasoning not re-rendered
    first, second = reconstruct([call(0, p0, s0), call(1, p1, [210, END])])

    assert first.call_ids == ["c0"] and second.call_ids == ["c1"]
    [record] = second.stats["breaks"]
    assert (record["reason"], record["position"]) == ("diverged", len(p0))
    assert (record["expected_token"], record["actual_token"]) == (think, 200)


def test_prompt_shorter_than_the_trajectory() -> None:
    p0 = OPENING + cue()
    s0 = [200, 201, END]
    p1 = p0 + s0 + [NL] + turn(USER, 120) + cue()
    s1 = [210, END]
    retry = p0 + s0 + [NL] + turn(USER, 120)  # history cut back inside the second prompt
    _, second = reconstruct([call(0, p0, s0), call(1, p1, s1), call(2, retry, [230, END])])

    [record] = second.stats["breaks"]
    assert record["reason"] == "shorter_prompt"
    assert record["position"] == len(retry)
    assert (record["expected_token"], record["actual_token"]) == (START, None)


def test_agent_labels_keep_identical_chains_apart() -> None:
    p0 = OPENING + cue()
    s0 = [200, END]
    p1 = p0 + s0 + [NL] + turn(USER, 120) + cue()
    calls = [
        call(0, p0, s0, agent="planner"),
        call(1, p0, s0, agent="coder"),
        call(2, p1, [210, END], agent="coder"),
        call(3, p1, [211, END], agent="planner"),
        call(4, p0, [220, END], agent=None),
    ]
    planner, coder, unlabelled = reconstruct(calls)

    assert (planner.agent, coder.agent, unlabelled.agent) == ("planner", "coder", None)
    assert planner.call_ids == ["c0", "c3"] and coder.call_ids == ["c1", "c2"]
    assert unlabelled.call_ids == ["c4"]
    assert all(t.stats["num_breaks"] == 0 for t in (planner, coder, unlabelled))


def test_retry_of_a_turn_starts_a_chain_that_later_calls_follow() -> None:
    p0 = OPENING + cue()
    s0 = [200, END]
    retried = [201, 202, END]
    p2 = p0 + retried + [NL] + turn(USER, 120) + cue()
    s2 = [210, END]
    p3 = p2 + s2 + [NL] + turn(USER, 130) + cue()
    calls = [call(0, p0, s0), call(1, p0, retried), call(2, p2, s2), call(3, p3, [220, END])]
    first, second = reconstruct(calls)
    assert first.token_ids == p0 + s0 and first.call_ids == ["c0"]
    assert second.call_ids == ["c1", "c2", "c3"]
    [record] = second.stats["breaks"]
    assert (record["reason"], record["position"]) == ("shorter_prompt", len(p0))
    assert (record["expected_token"], record["actual_token"]) == (200, None)


def test_longest_extending_trajectory_wins_even_if_created_later() -> None:
    p0 = OPENING + cue()
    s0 = [200, END]
    calls = [call(0, p0, s0), call(1, p0, [*s0, NL, 300])]  # the second chain outgrows the first
    p2 = p0 + s0 + [NL, 300, END, NL] + turn(USER, 120) + cue()
    first, second = reconstruct([*calls, call(2, p2, [210, END])])
    assert first.call_ids == ["c0"]
    assert second.call_ids == ["c1", "c2"]
    assert second.token_ids == [*p2, 210, END]


def test_longest_of_two_prefixes_is_chosen() -> None:
    p0 = OPENING + cue()
    s0 = [200, END]
    p1 = p0 + s0 + [NL] + turn(USER, 120) + cue()
    calls = [
        call(0, p0, s0, agent="a"),
        call(1, OPENING, [], agent="a"),  # a second chain that is a proper prefix of the first
        call(2, p1, [210, END], agent="a"),
    ]
    first, second = reconstruct(calls)
    assert second.stats["breaks"][0]["reason"] == "parallel"  # the first chain goes on at c2
    assert first.call_ids == ["c0", "c2"]
    assert second.call_ids == ["c1"]


def test_calls_are_taken_in_seq_order_and_tuples_are_accepted() -> None:
    p0 = OPENING + cue()
    s0 = [200, END]
    p1 = p0 + s0 + [NL] + turn(USER, 120) + cue()
    later = CapturedCall("c1", 1, "main", tuple(p1), (210, END), (-0.5, -0.25), "stop")
    [trajectory] = reconstruct([later, call(0, p0, s0)])
    assert trajectory.call_ids == ["c0", "c1"]
    assert trajectory.logprobs[-2:] == [-0.5, -0.25]


@pytest.mark.parametrize("logprobs", [[], [-0.5], [-0.5, -0.25, -0.125]])
def test_logprobs_stay_aligned_with_tokens(logprobs: list[float]) -> None:
    broken = CapturedCall("c0", 0, "main", OPENING, [200, END], logprobs, "stop")
    [trajectory] = reconstruct([broken])
    assert len(trajectory.logprobs) == len(trajectory.token_ids) == len(trajectory.loss_mask)
    assert trajectory.logprobs[-2:] == ([*logprobs, 0.0, 0.0])[:2]


def test_no_calls() -> None:
    assert reconstruct([]) == []


IMAGE = 8192


def _image(sha: str, offset: int) -> dict[str, object]:
    return {"sha256": sha, "offset": offset, "length": 4, "media_type": "image/png", "source": "user"}


def test_images_are_spans_of_the_trajectory_each_from_the_call_that_brought_it() -> None:
    first_prompt = [*turn(SYSTEM, 100), *turn(USER, IMAGE, IMAGE, IMAGE, IMAGE, 101), *cue()]
    first = CapturedCall("a", 1, None, first_prompt, [200, END], [-0.1, -0.2], "stop",
                         [_image("red", first_prompt.index(IMAGE))])  # fmt: skip
    second_prompt = [*first_prompt, 200, END, NL, *turn(USER, 102, IMAGE, IMAGE, IMAGE, IMAGE), *cue()]
    offset = len(first_prompt) + 3 + 4  # after the answer, its END and NL, and the user turn's opening and 102
    second = CapturedCall("b", 2, None, second_prompt, [201, END], [-0.3, -0.4], "stop",
                          [_image("red", first_prompt.index(IMAGE)), _image("blue", offset)])  # fmt: skip
    (trajectory,) = reconstruct([first, second])
    assert [(m["sha256"], m["call_id"], m["offset"]) for m in trajectory.media] == [
        ("red", "a", first_prompt.index(IMAGE)),
        ("blue", "b", offset),
    ]
    for span in trajectory.media:
        assert trajectory.token_ids[span["offset"] : span["offset"] + span["length"]] == [IMAGE] * 4
        assert set(trajectory.loss_mask[span["offset"] : span["offset"] + span["length"]]) == {0}
    assert reconstruct([call(1, first_prompt, [200, END])])[0].media == []


def test_a_trajectory_records_the_policy_versions_its_sampled_tokens_came_from() -> None:
    first_prompt = [*turn(SYSTEM, 100), *turn(USER, 101), *cue()]
    first = CapturedCall("a", 1, None, first_prompt, [200, END], [-0.1, -0.2], "stop", (), ("v1", "v1"))
    second_prompt = [*first_prompt, 200, END, NL, *turn(USER, 102), *cue()]
    second = CapturedCall("b", 2, None, second_prompt, [201, END], [-0.3, -0.4], "stop", (), ("v1", "v2"))
    (trajectory,) = reconstruct([first, second])
    assert trajectory.stats["policy_versions"] == ["v1", "v2"]  # the second call spanned a weight update
    (on_policy,) = reconstruct([first])
    assert on_policy.stats["policy_versions"] == ["v1"]
    assert reconstruct([call(1, first_prompt, [200, END])])[0].stats["policy_versions"] == []
