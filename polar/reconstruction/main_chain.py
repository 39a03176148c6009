"""Which trajectories are the session's main chain: the conversation the harness was run for, as opposed to its side
calls (a title or summary request, a tool's own use of the session's key), another agent's conversation or a
sub-agent it spawned.

    found = segments(chains, calls, texts)   # chains: prefix-merged, breaks explained (polar.stages.breaks)
    trajectories = marked(trajectories, main_calls(chains, main_flags(found)))
    answer = answer_call(calls, trajectories)   # the main chain's last answered call

The rule reads the session's segments (``polar.reconstruction.segments``): the main chain is the root segment (what
the main agent's longest trajectory descends from) and every segment that descends from it through edges that say
the same conversation went on (``GOES_ON``: a compaction, a fork, a rewrite, or a break nothing explains). A spawned
sub-agent, a side call, and what descends from them are not main. A reconstruction that is not prefix merging
(``per_request``: one trajectory per call) is marked by its calls: a trajectory is main when one of its calls is in a
main chain of the same calls merged (``main_calls``, ``marked``).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import replace

from polar.reconstruction.base import CapturedCall, TrajectoryData
from polar.reconstruction.segments import GOES_ON, Segment


def main_flags(found: Sequence[Segment]) -> list[bool]:
    """Per segment (in trajectory order), whether it is the session's main chain: the root and what descends from it
    through ``GOES_ON``."""
    flags: dict[int, bool] = {}
    for segment in found:
        path, at = [], segment
        # Up through continuing edges to the root, a segment already judged, or an edge that does not continue.
        while at.index not in flags and at.edge in GOES_ON and at.parent is not None and len(path) < len(found):
            path.append(at.index)
            at = found[at.parent]
        verdict = flags.get(at.index, at.edge is None and len(path) < len(found))
        for index in [*path, at.index]:
            flags[index] = flags.get(index, verdict)
    return [flags[segment.index] for segment in found]


def main_calls(chains: Sequence[TrajectoryData], flags: Sequence[bool]) -> frozenset[str]:
    """The call ids of the main chains."""
    return frozenset(call_id for chain, main in zip(chains, flags, strict=True) if main for call_id in chain.call_ids)


def marked(trajectories: Sequence[TrajectoryData], calls: Collection[str]) -> list[TrajectoryData]:
    """``trajectories`` with ``main`` set: whether one of their calls is among the main chain's ``calls``."""
    return [replace(t, main=any(call_id in calls for call_id in t.call_ids)) for t in trajectories]


def answer_call(calls: Sequence[CapturedCall], trajectories: Sequence[TrajectoryData]) -> CapturedCall | None:
    """The main chain's last answered call (by ``seq``), whose answer is the session's; None without one."""
    main = {call_id for t in trajectories if t.main for call_id in t.call_ids}
    return max((call for call in calls if call.call_id in main), key=lambda call: call.seq, default=None)
