"""``per_request``: one trajectory per call, ``prompt + completion`` with loss mask ``0…0 1…1``."""

from __future__ import annotations

from collections.abc import Sequence

from polar.reconstruction.base import CapturedCall, TrajectoryData


def reconstruct(calls: Sequence[CapturedCall]) -> list[TrajectoryData]:
    trajectories = []
    for call in sorted(calls, key=lambda c: c.seq):
        prompt, completion = list(call.prompt_token_ids), list(call.completion_token_ids)
        trajectories.append(
            TrajectoryData(
                agent=call.agent,
                token_ids=prompt + completion,
                loss_mask=[0] * len(prompt) + [1] * len(completion),
                logprobs=[0.0] * len(prompt) + list(call.logprobs),
                call_ids=[call.call_id],
                stats={
                    "prompt_tokens": len(prompt),
                    "completion_tokens": len(completion),
                    "finish_reason": call.finish_reason,
                    "policy_versions": list(dict.fromkeys(v for v in call.policy_versions if v is not None)),
                },
            )
        )
    return trajectories
