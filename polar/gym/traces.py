"""A session's trainable segments as NeMo Gym's ``training_traces`` v1 envelope (``TrainingTraceBatch``: NeMo Gym's
``nemo_gym/token_id_capture/training_traces.py``, proposed in Gym #3212 and trained on by NeMo RL #4078; not in the
0.7.0 wheel, so its rules are checked here, ``problems``):

    {"schema_version": 1, "rollout_id": <session id>, "builder": "prefix_merging",
     "traces": [{"trace_id", "model_call_ids", "token_ids", "generation_logprobs", "loss_mask",
                 "sampled_spans": [{"model_call_id", "start", "end"}], "segment": {"index", "edge", "parent"},
                 "media_spans": [{"sha256", "model_call_id", "start", "end", "media_type"}]}]}

One trace per trainable segment (``polar.reconstruction.segments``), built from the session's answered calls: a
segment's calls form one growing sequence, its tokens are its last call's prompt and completion, and each call's
completion is one sampled span (loss 1), everything else context (loss 0). The rules: ``loss_mask[0] == 0``; the
spans cover the mask exactly; each call is owned by exactly one span across all traces. A repeated ancestor (a
fork's shared history) stays context in the other trace. NeMo RL gives every trace the rollout's one advantage.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from polar.storage.serialization import CallJSON

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class SegmentCalls:
    """What the gym answer needs of one segment: its place in the rollout and its calls (in ``seq`` order)."""

    index: int
    edge: str | None
    parent: int | None
    trainable: bool
    call_ids: tuple[str, ...]
    masked: str | None = None  # why the sample is masked (an unexplained edge under segments: strict)


def training_traces(session_id: uuid.UUID, segments: Sequence[SegmentCalls],
                    calls: Mapping[str, CallJSON]) -> dict[str, Any]:  # fmt: skip
    """The envelope of ``segments`` (the trainable ones), from ``calls`` by id; a segment's calls that were not
    answered (absent from ``calls``) are left out of its trace."""
    traces = []
    for segment in segments:
        mine = [calls[c] for c in segment.call_ids if c in calls]
        if not mine:
            continue
        last = mine[-1]
        tokens = [*last["prompt_token_ids"], *last["completion_token_ids"]]
        mask = [0] * len(tokens)
        logprobs = [0.0] * len(tokens)
        spans = []
        for call in mine:
            start = len(call["prompt_token_ids"])
            end = start + len(call["completion_token_ids"])
            mask[start:end] = [1] * (end - start)
            given = [float(x) if x is not None else 0.0 for x in call["logprobs"][: end - start]]
            logprobs[start:end] = given + [0.0] * (end - start - len(given))  # a capture without logprobs: 0.0
            spans.append({"model_call_id": call["call_id"], "start": start, "end": end})
        # The trace is its last call's tokens: its images are that call's, each with the call that brought it in.
        brought: dict[tuple[str, int], str] = {}
        for call in mine:
            for m in call.get("media") or ():
                if m.get("offset") is not None:
                    brought.setdefault((m["sha256"], m["offset"]), call["call_id"])
        media = [
            {"sha256": m["sha256"], "model_call_id": brought[(m["sha256"], m["offset"])], "start": m["offset"],
             "end": m["offset"] + m["length"], "media_type": m.get("media_type")}
            for m in last.get("media") or () if m.get("offset") is not None
        ]  # fmt: skip
        traces.append({
            "trace_id": f"{session_id}:{segment.index}",
            "model_call_ids": [call["call_id"] for call in mine],
            "token_ids": tokens, "generation_logprobs": logprobs, "loss_mask": mask, "sampled_spans": spans,
            "segment": {"index": segment.index, "edge": segment.edge, "parent": segment.parent},
            "media_spans": media,
        })  # fmt: skip
    return {"schema_version": SCHEMA_VERSION, "rollout_id": str(session_id), "builder": "prefix_merging",
            "traces": traces}  # fmt: skip


def problems(envelope: Mapping[str, Any], calls: Mapping[str, CallJSON]) -> list[str]:
    """Where the envelope breaks the v1 rules, or a trace is not its calls' tokens as captured (empty: none)."""
    found = []
    owners: dict[str, int] = {}
    for trace in envelope["traces"]:
        tokens, mask, name = trace["token_ids"], trace["loss_mask"], trace["trace_id"]
        if not (len(tokens) == len(mask) == len(trace["generation_logprobs"])):
            found.append(f"{name}: token_ids, loss_mask and generation_logprobs differ in length")
            continue
        if mask and mask[0] != 0:
            found.append(f"{name}: loss_mask[0] is not 0")
        covered = [0] * len(mask)
        for span in trace["sampled_spans"]:
            call = calls.get(span["model_call_id"])
            owners[span["model_call_id"]] = owners.get(span["model_call_id"], 0) + 1
            covered[span["start"] : span["end"]] = [1] * (span["end"] - span["start"])
            if call is None or tokens[: span["start"]] != call["prompt_token_ids"]:
                found.append(f"{name}: call {span['model_call_id']}'s prompt is not the trace before its span")
            elif tokens[span["start"] : span["end"]] != call["completion_token_ids"]:
                found.append(f"{name}: call {span['model_call_id']}'s span is not its sampled tokens")
        if covered != list(mask):
            found.append(f"{name}: the sampled spans do not cover the loss mask exactly")
    found += [f"call {call_id} is owned by {count} spans" for call_id, count in owners.items() if count != 1]
    return found
