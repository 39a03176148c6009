"""``prefix_merging``: one training sequence per agent chain, built by strict token-prefix chaining (DESIGN.md §5).

    from polar.reconstruction import prefix_merging
    trajectories = prefix_merging.reconstruct(calls)

Merge rules, applied to the calls in ``seq`` order:

1. A call may only extend a trajectory of the same ``agent`` label (``None`` is a label like any other).
2. A trajectory *extends into* a call when its whole token sequence (every prompt and sampled token so far) is
   a token prefix of the call's prompt. Equality counts: a prompt that re-sends the trajectory unchanged (e.g.
   "continue" after a turn cut by ``length``) extends it with no interstitial tokens. Every trajectory stays
   open for the whole session, so a main agent can resume after a sub-agent ran.
3. Among the trajectories that extend into the call, the longest wins (ties: the one created first).
4. The prompt tokens beyond the trajectory (tool results, user turns, template tokens) are appended with mask 0
   and logprob 0.0; then the sampled tokens with mask 1 and their logprobs. Sampled ids are taken as captured,
   never re-tokenised.
5. End of turn: a normal turn samples the end-of-turn token (``<|im_end|>``) itself, so it is trained (mask 1)
   and the next prompt's re-rendering ``<|im_end|>\\n<|im_start|>…`` still starts with the trajectory. A turn cut
   by ``finish_reason == "length"`` (or ended by a stop string) sampled no end-of-turn token; the next prompt's
   template closes it, so that ``<|im_end|>`` arrives as an interstitial token with mask 0. The model never
   produced it, so it is not trained on — and the chain is unbroken.
6. When nothing extends into the call it starts a new trajectory. If the agent already has trajectories this is a
   *break*, recorded in the new trajectory's ``stats["breaks"]`` (see ``_break``). The agent's first call is no
   break.

Break reasons, judged against the *nearest* trajectory of the agent: the longest common prefix with the prompt
among the trajectories the prompt shares sampled history with (it agrees with at least their whole first
prompt), or among all of the agent's trajectories if it shares sampled history with none:

- ``"new_conversation"``: the prompt shares no sampled history with any trajectory of the agent (it differs
  within the first prompt of each: another system prompt or first user message): a title generator, a
  summariser, a second conversation. A new chain, not a failure.
- ``"parallel"``: the same, and one of those trajectories is extended again by a later call, i.e. it continues
  independently: a parallel sub-agent, or a second conversation run alongside.
- ``"shorter_prompt"``: otherwise, if the prompt is shorter than the nearest trajectory: compaction, history cut
  back, a retry of an earlier turn. ``actual_token`` is ``None`` when the prompt agrees up to its end.
- ``"diverged"``: otherwise: the prompt is at least as long but differs at ``position``: rewritten history, or a
  chat template that re-renders earlier turns differently (e.g. drops reasoning).

Tokens alone cannot tell compaction from a rewind, or a dropped reasoning block from a rewritten tool result;
``break_reasons.explain`` refines ``shorter_prompt`` and ``diverged`` from the calls' messages. What tokens do tell
is whether a related break branches at one of the nearest trajectory's call boundaries (``boundary``): the prompt
repeats a call's prompt exactly (``"at": "prompt"``: a resample), or it keeps a call's sampled tokens whole and
differs only in what came after them (``"at": "end"``: two calls extending one chain state). ``segments`` reads it
as a ``fork``.

Stats of each trajectory (JSON-ready): ``num_calls``, ``prompt_tokens`` (mask 0), ``completion_tokens`` (mask 1),
``finish_reasons`` (one per call, in ``call_ids`` order), ``spans`` (per call, ``[start, end)`` of its sampled
tokens in ``token_ids``), ``num_breaks`` and ``breaks`` (0 or 1 record: the break of the call that started it).

Cost: each extension test is one C-level slice comparison, so a call costs O(prompt length) per open
trajectory of its agent; locating a break's first differing position scans in blocks of ``_BLOCK`` tokens.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from polar.reconstruction.base import CapturedCall, TrajectoryData

_BLOCK = 256


@dataclass(slots=True)
class _Chain:
    """A trajectory under construction; private and mutable, frozen into ``TrajectoryData`` at the end."""

    agent: str | None
    opening: int
    last_seq: int
    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    call_ids: list[str] = field(default_factory=list)
    finish_reasons: list[str | None] = field(default_factory=list)
    breaks: list[dict[str, Any]] = field(default_factory=list)
    spans: list[list[int]] = field(default_factory=list)
    media: list[dict[str, Any]] = field(default_factory=list)
    versions: list[str | None] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def append(self, call: CapturedCall, prompt: list[int]) -> None:
        interstitial = prompt[len(self.token_ids) :]
        completion = list(call.completion_token_ids)
        # The images this call's prompt adds (those before it were brought in by the calls it extends).
        self.media += [
            {"sha256": m["sha256"], "call_id": call.call_id, "offset": m["offset"], "length": m["length"],
             "media_type": m.get("media_type")}
            for m in call.media
            if m.get("offset") is not None and m["offset"] >= len(self.token_ids)
        ]  # fmt: skip
        self.token_ids += interstitial
        self.spans.append([len(self.token_ids), len(self.token_ids) + len(completion)])
        self.token_ids += completion
        self.loss_mask += [0] * len(interstitial)
        self.loss_mask += [1] * len(completion)
        self.logprobs += [0.0] * len(interstitial)
        self.logprobs += _fit(call.logprobs, len(completion))
        self.call_ids.append(call.call_id)
        for version in call.policy_versions:
            if version not in self.versions:
                self.versions.append(version)
        self.last_seq = call.seq
        self.finish_reasons.append(call.finish_reason)
        self.prompt_tokens += len(interstitial)
        self.completion_tokens += len(completion)

    def freeze(self) -> TrajectoryData:
        return TrajectoryData(
            agent=self.agent,
            token_ids=self.token_ids,
            loss_mask=self.loss_mask,
            logprobs=self.logprobs,
            call_ids=self.call_ids,
            stats={
                "num_calls": len(self.call_ids),
                "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens,
                "finish_reasons": self.finish_reasons,
                "spans": self.spans,
                "num_breaks": len(self.breaks),
                "breaks": self.breaks,
                # The policy versions its sampled tokens came from, in the order they first appear (one for an
                # on-policy trajectory; calls stamped with none are left out).
                "policy_versions": [version for version in self.versions if version is not None],
            },
            media=self.media,
        )


def reconstruct(calls: Sequence[CapturedCall]) -> list[TrajectoryData]:
    """Merge a session's calls into one trajectory per agent chain; trajectories come in order of creation."""
    chains: list[_Chain] = []
    by_agent: dict[str | None, list[int]] = {}
    unrelated: list[tuple[dict[str, Any], list[int]]] = []
    for call in sorted(calls, key=lambda c: c.seq):
        prompt = _as_list(call.prompt_token_ids)
        indices = by_agent.setdefault(call.agent, [])
        target = _longest_extending(chains, indices, prompt)
        if target is None:
            target = _Chain(agent=call.agent, opening=len(prompt), last_seq=call.seq)
            if indices:
                record, related = _break(call, prompt, chains, indices)
                target.breaks.append(record)
                if not related:
                    unrelated.append((record, list(indices)))
            indices.append(len(chains))
            chains.append(target)
        target.append(call, prompt)
    # Only now is it known whether a trajectory the call shared nothing sampled with went on independently.
    for record, rivals in unrelated:
        if any(chains[index].last_seq > record["seq"] for index in rivals):
            record["reason"] = "parallel"
    return [chain.freeze() for chain in chains]


def _as_list(tokens: Sequence[int]) -> list[int]:
    # Slices of a list compare against lists only; stored arrays may arrive as tuples.
    return tokens if isinstance(tokens, list) else list(tokens)


def _fit(logprobs: Sequence[float], length: int) -> list[float]:
    # Keep the three lists aligned even if a capture lost logprobs: missing ones read as 0.0.
    values = list(logprobs[:length])
    return values + [0.0] * (length - len(values))


def _extends(tokens: list[int], prompt: list[int]) -> bool:
    size = len(tokens)
    if size > len(prompt):
        return False
    # The last-token check rejects most non-matches before the full slice comparison.
    return size == 0 or (prompt[size - 1] == tokens[-1] and prompt[:size] == tokens)


def _longest_extending(chains: list[_Chain], indices: list[int], prompt: list[int]) -> _Chain | None:
    best: _Chain | None = None
    for index in indices:
        chain = chains[index]
        if (best is None or len(chain.token_ids) > len(best.token_ids)) and _extends(chain.token_ids, prompt):
            best = chain
    return best


def common_prefix(left: Sequence[int], right: Sequence[int]) -> int:
    """How many leading ids the two share (compared a block at a time, then id by id within the first block that
    differs)."""
    limit = min(len(left), len(right))
    start = 0
    while start < limit and left[start : start + _BLOCK] == right[start : start + _BLOCK]:
        start += _BLOCK
    for position in range(start, min(start + _BLOCK, limit)):
        if left[position] != right[position]:
            return position
    return limit


def _token_reason(related: bool, shorter: bool) -> str:
    if not related:
        return "new_conversation"  # may become "parallel" once it is known whether the rival went on
    return "shorter_prompt" if shorter else "diverged"


def _break(
    call: CapturedCall, prompt: list[int], chains: list[_Chain], indices: list[int]
) -> tuple[dict[str, Any], bool]:
    """Why ``call`` extends none of ``indices``, judged against the nearest trajectory; and whether the prompt
    shares sampled history with any of them (if not, ``reconstruct`` may relabel the break ``"parallel"``).

    The record: ``call_id``, ``seq``, ``agent``, ``reason``, ``position`` (first index where prompt and that
    trajectory differ), ``expected_token`` (the trajectory's token there), ``actual_token`` (the prompt's, or
    ``None`` when the prompt ended), ``trajectory_index`` (the nearest trajectory's index in the result),
    ``boundary`` (``{"call_id", "at"}`` when the break branches at one of its call boundaries, else ``None``).
    """
    shared = [(common_prefix(chains[index].token_ids, prompt), index) for index in indices]
    related = [(length, index) for length, index in shared if length >= chains[index].opening]
    position, index = max(related or shared, key=lambda pair: (pair[0], -pair[1]))
    nearest = chains[index].token_ids
    record = {
        "call_id": call.call_id,
        "seq": call.seq,
        "agent": call.agent,
        "reason": _token_reason(bool(related), len(prompt) < len(nearest)),
        "position": position,
        "expected_token": nearest[position],
        "actual_token": prompt[position] if position < len(prompt) else None,
        "trajectory_index": index,
        "boundary": _boundary(chains[index], position, len(prompt)) if related else None,
    }
    return record, bool(related)


def _boundary(chain: _Chain, position: int, prompt_length: int) -> dict[str, Any] | None:
    """The call boundary of ``chain`` a prompt that first differs from it at ``position`` branches at: the prompt
    ends where a call's sampled tokens start (it repeats that call's prompt), or it differs after a call's sampled
    tokens, within what the environment added (not at its first token: a stop-string turn's template end-of-turn
    sits there). None when it differs inside sampled tokens or before the first call's."""
    starts = [start for start, _ in chain.spans]
    if position == prompt_length:
        at = bisect_left(starts, position)
        if at < len(starts) and starts[at] == position:
            return {"call_id": chain.call_ids[at], "at": "prompt"}
    if chain.loss_mask[position] != 0:
        return None
    last = bisect_left([end for _, end in chain.spans], position) - 1  # the last call that ended before it
    return {"call_id": chain.call_ids[last], "at": "end"} if last >= 0 else None
