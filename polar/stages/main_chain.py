"""The main chain marked on a session's trajectories in postrun (``polar.reconstruction.main_chain`` decides it).

The rule reads prefix-merged chains with their breaks explained; a session reconstructed another way (``per_request``)
is merged here too, only to tell which of its calls are the main chain's (breaks explained the same way, so the cost
is that of its breaks: none for one conversation)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from polar.reconstruction import CapturedCall, TrajectoryData, prefix_merging
from polar.reconstruction.main_chain import main_calls, main_flags, marked
from polar.stages.breaks import explain_breaks


def mark_main(
    connection: Any,
    session_id: uuid.UUID,
    calls: Sequence[CapturedCall],
    trajectories: list[TrajectoryData],
    reconstruction: str,
) -> list[TrajectoryData]:
    """``trajectories`` (breaks explained) with ``main`` set on each."""
    chains = trajectories
    if reconstruction != "prefix_merging":
        chains = explain_breaks(connection, session_id, calls, prefix_merging.reconstruct(calls))
    return marked(trajectories, main_calls(chains, main_flags(chains)))
