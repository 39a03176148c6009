"""The breaks explained, and the main chain and the segments marked, on a session's trajectories in postrun
(``polar.stages.breaks``, ``polar.reconstruction.main_chain`` and ``polar.reconstruction.segments`` decide them).

Both rules read prefix-merged chains with their breaks explained; a session reconstructed another way
(``per_request``) is merged here too, only to tell which of its calls are the main chain's and which segment each
call belongs to (breaks explained the same way, so the cost is that of its breaks: none for one conversation).
Segment evidence reads every call's answer and the prompts of each chain's first and last call, and only when the
session has more than one chain; the session's stored rows are then read once, for the breaks and the evidence."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from polar.reconstruction import CapturedCall, TrajectoryData, prefix_merging
from polar.reconstruction.break_reasons import answer_of, messages_of
from polar.reconstruction.main_chain import main_calls, main_flags, marked
from polar.reconstruction.segments import CallText, Mode, Segment, loaded_prompts, needs_text, segments
from polar.stages.breaks import explain_breaks
from polar.storage.calls.read import rebuild, session_rows


def annotate(
    connection: Any,
    session_id: uuid.UUID,
    calls: Sequence[CapturedCall],
    trajectories: list[TrajectoryData],
    reconstruction: str,
    mode: Mode = "strict",
) -> list[TrajectoryData]:
    """``trajectories`` with their breaks explained (prefix merging's) and ``main`` and ``segment`` set on each."""
    merged = prefix_merging.reconstruct(calls) if reconstruction != "prefix_merging" else trajectories
    # More than one chain is what breaks and evidence need: a session of one conversation reads nothing here.
    rows = _stored_rows(connection, session_id, calls) if needs_text(merged) else None
    chains = explain_breaks(connection, session_id, calls, merged, rows)
    if reconstruction == "prefix_merging":
        trajectories = chains
    found = segments(chains, calls, _texts(rows, calls, chains), mode)
    main = marked(trajectories, main_calls(chains, main_flags(found)))
    if chains is trajectories:
        return [replace(t, segment=s.as_json()) for t, s in zip(main, found, strict=True)]
    of_call = {call_id: s for chain, s in zip(chains, found, strict=True) for call_id in chain.call_ids}
    return [replace(t, segment=_of(t, of_call)) for t in main]


def _of(trajectory: TrajectoryData, of_call: dict[str, Segment]) -> dict[str, Any] | None:
    # A per-request trajectory is one call: it belongs to its call's chain's segment.
    segment = of_call.get(trajectory.call_ids[0]) if trajectory.call_ids else None
    return segment.as_json() if segment is not None else None


def _stored_rows(connection: Any, session_id: uuid.UUID, calls: Sequence[CapturedCall]) -> Sequence[Any]:
    """The session's stored rows with both payload parts, up to its last captured call."""
    last = max(call.seq for call in calls)
    return session_rows(connection, session_id, up_to_seq=last, parts=["normalized_request", "response"])


def _texts(
    rows: Sequence[Any] | None, calls: Sequence[CapturedCall], chains: Sequence[TrajectoryData]
) -> dict[str, CallText]:
    """Every call's answer, and the prompt messages of each chain's first and last call (nothing without ``rows``)."""
    if rows is None:
        return {}
    answers = rebuild(rows, None, prompts=False, parts=["response"])
    prompts = rebuild(rows, {uuid.UUID(c) for c in loaded_prompts(chains)}, prompts=False, parts=["normalized_request"])
    texts = {}
    for call in calls:
        key = uuid.UUID(call.call_id)
        whole, asked = answers.get(key), prompts.get(key)
        texts[call.call_id] = CallText(messages_of(asked.normalized_request) if asked is not None else None,
                                       answer_of(whole.response) if whole is not None else None)  # fmt: skip
    return texts
