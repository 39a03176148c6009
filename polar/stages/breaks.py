"""Merge breaks told from the messages: postrun loads what the breaking call sent and what its nearest chain last
saw and answered, and ``polar.reconstruction.break_reasons`` judges the reason. Only break calls and their chains'
last calls are read, so a session without breaks costs nothing here."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from polar.reconstruction import CapturedCall, TrajectoryData
from polar.reconstruction.break_reasons import UNEXPLAINED, answer_of, explain, messages_of, tools_of
from polar.storage.calls.read import rebuild, session_rows


def explain_breaks(
    connection: Any,
    session_id: uuid.UUID,
    calls: Sequence[CapturedCall],
    trajectories: list[TrajectoryData],
    rows: Sequence[Any] | None = None,
) -> list[TrajectoryData]:
    """``trajectories`` with every break's reason judged from the calls' messages (``break_reasons``); ``rows``: the
    session's stored rows with both payload parts, when the caller has read them already (else read here, up to the
    last call a break needs)."""
    records = [record for t in trajectories for record in t.stats.get("breaks") or []]
    if not records:
        return trajectories
    seqs = {call.call_id: call.seq for call in calls}
    pairs = {id(record): (record["call_id"], _previous(trajectories[record["trajectory_index"]], seqs, record))
             for record in records}  # fmt: skip
    wanted = {uuid.UUID(call_id) for pair in pairs.values() for call_id in pair if call_id is not None}
    last = max(seqs[str(call_id)] for call_id in wanted)
    if rows is None:
        rows = session_rows(connection, session_id, up_to_seq=last, parts=["normalized_request", "response"])
    whole = rebuild(rows, wanted, prompts=False, parts=["normalized_request", "response"])
    judged = []
    for trajectory in trajectories:
        breaks = [
            _judge(record, *pairs[id(record)], whole, trajectories) for record in trajectory.stats.get("breaks") or []
        ]
        judged.append(replace(trajectory, stats={**trajectory.stats, "breaks": breaks}) if breaks else trajectory)
    return judged


def unexplained(trajectories: Sequence[TrajectoryData]) -> list[dict[str, Any]]:
    """The breaks no reason explains."""
    return [r for t in trajectories for r in t.stats.get("breaks") or [] if r.get("reason") in UNEXPLAINED]


def _previous(chain: TrajectoryData, seqs: dict[str, int], record: dict[str, Any]) -> str | None:
    """The chain's last call before the break."""
    earlier = [call_id for call_id in chain.call_ids if seqs[call_id] < record["seq"]]
    return earlier[-1] if earlier else None


def _judge(
    record: dict[str, Any],
    call_id: str,
    previous: str | None,
    whole: dict[uuid.UUID, Any],
    chains: list[TrajectoryData],
) -> dict[str, Any]:
    if previous is None:
        return record
    breaking, chain_call = whole.get(uuid.UUID(call_id)), whole.get(uuid.UUID(previous))
    if breaking is None or chain_call is None:
        return record
    before = messages_of(chain_call.normalized_request)
    answer = answer_of(chain_call.response)
    if before is not None and answer is not None:
        before = [*before, answer]
    mask = chains[record["trajectory_index"]].loss_mask
    position = record["position"]
    # Inside a sampled turn, or right after one (the template's own end-of-turn where the model stopped on a stop).
    sampled = any(0 <= i < len(mask) and mask[i] == 1 for i in (position, position - 1))
    return explain(
        record,
        before,
        messages_of(breaking.normalized_request),
        tools_of(chain_call.normalized_request),
        tools_of(breaking.normalized_request),
        sampled,
    )
