"""Values that reconstruction reads and writes: captured calls in, trajectories out. Pure data, no I/O."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class CapturedCall:
    call_id: str
    seq: int
    agent: str | None
    prompt_token_ids: Sequence[int]
    completion_token_ids: Sequence[int]
    logprobs: Sequence[float]
    finish_reason: str | None
    # Its images (``ModelCall.media``: sha256, media_type, offset and length in its prompt ids, …), in prompt order.
    media: Sequence[Mapping[str, Any]] = ()
    # The policy versions it started and ended under (``model_calls.policy_version`` / ``_end``).
    policy_versions: tuple[str | None, str | None] = (None, None)


@dataclass(frozen=True)
class TrajectoryData:
    agent: str | None
    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    call_ids: list[str]
    stats: dict[str, Any] = field(default_factory=dict)
    # The session's main chain, not a side call (``polar.reconstruction.main_chain``; postrun sets it).
    main: bool = True
    # Its segment of the session's rollout: index, edge, parent, evidence (``polar.reconstruction.segments``).
    segment: dict[str, Any] | None = None
    # Its images' spans: ``sha256``, ``call_id`` (the call that brought it in), ``offset`` and ``length`` in
    # ``token_ids``, ``media_type``; empty without images.
    media: list[dict[str, Any]] = field(default_factory=list)


class Reconstruction(Protocol):
    def __call__(self, calls: Sequence[CapturedCall]) -> list[TrajectoryData]:
        """Training sequences from a session's calls, in call order."""
        ...
