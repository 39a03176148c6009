"""Which trajectories are the session's main chain: the conversation the harness was run for, as opposed to its side
calls (a title or summary request, a tool's own use of the session's key, another agent's conversation).

    flags = main_flags(chains)               # chains: prefix-merged, breaks explained (polar.stages.breaks)
    trajectories = marked(trajectories, main_calls(chains, flags))
    answer = answer_call(calls, trajectories)   # the main chain's last answered call

The rule, over prefix-merged chains in order of creation (``prefix_merging.reconstruct``):

1. The main agent is the agent label of the session's first answered call (the first chain's).
2. The main chain starts at that agent's longest trajectory (most tokens; ties: the first created).
3. A trajectory whose break says the same conversation went on (``CONTINUES``: compaction, truncation, a rewritten
   tool result, history or answer, dropped reasoning, re-tokenisation, changed tools, or an unexplained
   ``diverged`` / ``shorter_prompt``) is joined to the trajectory its break names (``trajectory_index``, the
   nearest one); the main chain is everything joined to its start, transitively, in either direction.
4. A trajectory that began as ``new_conversation`` or ``parallel`` (another system prompt or opening) is not joined
   to anything, and other agents' trajectories never are: neither is main unless rule 2 started there.

``_is_main`` applies the rule to one trajectory, so a later rule (a spawned sub-agent trained too) is one place.
A reconstruction that is not prefix merging (``per_request``: one trajectory per call) is marked by its calls: a
trajectory is main when one of its calls is in a main chain of the same calls merged (``main_calls``, ``marked``).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import replace

from polar.reconstruction.base import CapturedCall, TrajectoryData

# Break reasons (``prefix_merging``, ``break_reasons``) that mean the conversation went on in the new trajectory.
CONTINUES = frozenset({
    "compaction", "truncation", "tool_result_rewritten", "history_rewritten", "answer_rewritten",
    "reasoning_dropped", "retokenized", "tools_changed", "diverged", "shorter_prompt",
})  # fmt: skip


def main_flags(chains: Sequence[TrajectoryData]) -> list[bool]:
    """Per chain (prefix-merged, in order of creation), whether it is the session's main chain."""
    if not chains:
        return []
    joined = _joined(chains, longest(chains))
    return [_is_main(index, joined) for index in range(len(chains))]


def longest(chains: Sequence[TrajectoryData]) -> int:
    """Rule 2: the main agent's longest trajectory (chains not empty)."""
    agent = chains[0].agent
    return max((i for i, chain in enumerate(chains) if chain.agent == agent),
               key=lambda i: (len(chains[i].token_ids), -i))  # fmt: skip


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


def _is_main(index: int, joined: Collection[int]) -> bool:
    """The rule for one trajectory: it is joined to the main chain's start."""
    return index in joined


def _joined(chains: Sequence[TrajectoryData], start: int) -> set[int]:
    """The trajectories joined to ``start`` by breaks that continue a conversation (rule 3), ``start`` included."""
    edges: dict[int, set[int]] = {}
    for index, chain in enumerate(chains):
        for record in chain.stats.get("breaks") or []:
            nearest = record.get("trajectory_index")
            if record.get("reason") in CONTINUES and isinstance(nearest, int) and 0 <= nearest < len(chains):
                edges.setdefault(index, set()).add(nearest)
                edges.setdefault(nearest, set()).add(index)
    joined, frontier = {start}, [start]
    while frontier:
        for other in edges.get(frontier.pop(), ()):
            if other not in joined:
                joined.add(other)
                frontier.append(other)
    return joined
