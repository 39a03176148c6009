"""per_request: one trajectory per call, prompt masked 0 and completion masked 1."""

from __future__ import annotations

from polar.reconstruction import RECONSTRUCTIONS, CapturedCall
from polar.reconstruction.per_request import reconstruct


def test_one_trajectory_per_call_in_seq_order() -> None:
    calls = [
        CapturedCall("b", 1, "main", [1, 2, 3, 4], [7], [-0.5], "length"),
        CapturedCall("a", 0, None, [1, 2], [5, 6], [-0.25, -0.125], "stop"),
    ]
    first, second = reconstruct(calls)

    assert first.call_ids == ["a"] and first.agent is None
    assert first.token_ids == [1, 2, 5, 6]
    assert first.loss_mask == [0, 0, 1, 1]
    assert first.logprobs == [0.0, 0.0, -0.25, -0.125]
    assert first.stats == {"prompt_tokens": 2, "completion_tokens": 2, "finish_reason": "stop", "policy_versions": []}
    assert second.call_ids == ["b"] and second.agent == "main"
    assert second.token_ids == [1, 2, 3, 4, 7]
    assert second.loss_mask == [0, 0, 0, 0, 1]
    assert second.stats["finish_reason"] == "length"


def test_registered_and_empty() -> None:
    assert RECONSTRUCTIONS["per_request"] is reconstruct
    assert reconstruct([]) == []
