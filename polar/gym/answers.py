"""A settled session as NeMo Gym's answer to ``/run`` (``BaseVerifyResponse``, NeMo Gym 0.7.0): the row, echoed,
plus ``response``, ``reward``, ``reward_components`` (they sum to ``reward``), and the top-level ``mask_sample``,
``failure_kind`` (a name from NeMo Gym's shared vocabulary, ``nemo_gym/failure_kinds.py``, or Polar's own as
``polar:<kind>``) and ``failure_reason`` (the occurrence, in words).

NeMo RL trains on the output items that carry ``prompt_token_ids``, ``generation_token_ids`` and
``generation_log_probs`` (the last item of each model call; its reasoning, text and tool calls come before it,
without tokens), and it requires each such item's prompt to start with every token seen before it: the calls must
form one growing sequence. Polar's calls are what the engine served, so the ids and logprobs are the captured
ones. Only the main chain's calls are answered (``polar.reconstruction.main_chain``; ``all_chains`` takes every
call): a side call (a title request, a tool's own use of the session's key) is left out, counted in
``polar.calls_left_out``. Which answer a session gets (status codes follow NeMo RL's retry rules: 5xx, 408 and 429
are the infrastructure's and retried; any other 4xx is the row's own):

- its sample settled with a task outcome and its calls form one sequence sampled under one policy: 200, the
  evaluator's reward, ``mask_sample: false``; a harness that timed out or failed was still measured, so its
  ``failure_kind`` (``agent_timeout``, ``agent_run_error``) is named but the sample is not masked;
- a session in several segments (a compaction, a sub-agent, a fork: ``polar.reconstruction.segments``) is answered
  whole: ``training_traces`` holds one trace per trainable segment (``polar.gym.traces``, NeMo Gym's v1 envelope),
  ``response`` the main segment's calls, and the sample is not masked;
- 200 with ``mask_sample: true`` (also in ``instance_config``, where NeMo RL reads it), never a silent 0, when the
  reward does not measure the policy: a segment's break has no explained edge under ``segments: strict``
  (``polar:unexplained_segment``), the calls break into several sequences and no segments say how (a session
  stored before segments; the sequence holding the last call is returned, ``polar:split_token_sequences``), a
  returned call's
  tokens were sampled across a policy update (``polar:spans_policy_update``, AUDIT F7), no evaluator scored it
  (``verifier_error``), or the session was cancelled (``cancelled``);
- no model call at all: 422 (the row ran, but there is no sample; NeMo RL treats it as the row's fault); an
  attempt stored ``excluded`` (its harness got no model answer: the policy never acted) says so,
  ``polar:no_model_calls``, and its stored reward is never sent;
- the sample's last attempt was lost to the infrastructure: 503 ``session_lost``, which NeMo RL retries (Polar
  already retried it ``max_attempts`` times).
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from polar.gym.traces import SegmentCalls, training_traces
from polar.protocols._base import EngineAnswer
from polar.storage.serialization import CallJSON


@dataclass(frozen=True)
class Settled:
    """What the waiter saw of a row's sample once its latest attempt ended."""

    session_id: uuid.UUID
    state: str
    outcome_class: str | None
    reward: float | None
    attempt: int
    error: str | None
    evaluator: str | None = None  # the task's evaluator, which names the one reward component it gives
    evaluation: dict[str, Any] | None = None  # its stored details; ``reward_components`` there are passed on
    # The calls of its trajectories outside the main chain (a title request, a tool's own use of the session's key:
    # ``polar.reconstruction.main_chain``), left out of the answer unless every chain is asked for.
    side_calls: frozenset[str] = frozenset()
    # Its segments (``polar.gym.traces.SegmentCalls``); empty for sessions stored before segments.
    segments: tuple[SegmentCalls, ...] = ()

    @property
    def masked(self) -> str | None:
        """Why its segments mask the sample (an unexplained edge under ``segments: strict``), or None."""
        return next((s.masked for s in self.segments if s.masked), None)


@dataclass(frozen=True)
class Answer:
    status: int
    body: dict[str, Any]


def gym_answer(
    row: dict[str, Any], settled: Settled, calls: Sequence[CallJSON], model: str, all_chains: bool = False
) -> Answer:
    """The ``/run`` answer for ``row`` whose sample settled as ``settled`` with ``calls`` (in ``seq`` order): the
    main chain's calls (every call with ``all_chains``)."""
    polar = {"session_id": str(settled.session_id), "state": settled.state, "attempt": settled.attempt}
    if settled.outcome_class == "infrastructure":
        return _error(503, f"the session's last attempt ({settled.attempt}) was lost to the infrastructure: "
                           f"{settled.error}; send the row again", polar, SESSION_LOST)  # fmt: skip
    if settled.outcome_class == "excluded":
        return _error(422, f"the session ended {settled.state} without a model call answered, so the policy never "
                           f"acted and there is no sample ({settled.error or 'no error recorded'})", polar,
                      NO_MODEL_CALLS)  # fmt: skip
    answered = [c for c in calls if c["delivered"] and c["status_code"] == 200 and not c.get("synthesized")]
    delivered = [c for c in answered if all_chains or c["call_id"] not in settled.side_calls]
    if not delivered:
        kind = CANCELLED if settled.state == "cancelled" else AGENT_RUN_ERROR
        return _error(422, f"the session ended {settled.state} without a model call, so there is no sample "
                           f"({settled.error or 'no error recorded'})", polar, kind)  # fmt: skip
    traces = None
    if settled.segments:
        delivered, kept, traces, split = _segmented(settled, answered, all_chains)
    else:
        runs = sequences(delivered)
        kept = runs[-1]
        split = (f"its {len(delivered)} calls form {len(runs)} token sequences, not one; the last ({len(kept)} "
                 "calls) is returned") if len(runs) > 1 else None  # fmt: skip
    masks = _masks(settled, delivered if traces is not None else kept, split)
    reward = 0.0 if settled.reward is None or settled.state == "cancelled" else float(settled.reward)
    versions = sorted({v for call in kept for v in (call.get("policy_version"), call.get("policy_version_end")) if v})
    body = {
        **row,
        "response": response(kept, model, settled.session_id),
        "reward": reward,
        "reward_components": reward_components(settled, reward),
        "mask_sample": bool(masks),
        "failure_kind": masks[0][0] if masks else _degraded(settled.state),
        "failure_reason": "; ".join(reason for _, reason in masks) if masks else settled.error,
        "polar": {
            **polar,
            "calls": len(delivered),
            "calls_returned": len(kept),
            "policy_versions": versions,
            "calls_left_out": len(answered) - len(delivered),
        },
    }
    if traces is not None:
        body["training_traces"] = traces
    if masks:
        given = row.get("instance_config")
        body["instance_config"] = {**(given if isinstance(given, dict) else {}), "mask_sample": True}
        body["polar"]["mask_reason"] = body["failure_reason"]
    return Answer(200, body)


# NeMo Gym 0.7.0's shared failure names (nemo_gym/failure_kinds.py) this answer uses, and Polar's own.
SESSION_LOST = "session_lost"
CANCELLED = "cancelled"
AGENT_RUN_ERROR = "agent_run_error"
AGENT_TIMEOUT = "agent_timeout"
VERIFIER_ERROR = "verifier_error"
PERSISTENCE_FAILED = "persistence_failed"
SPLIT_SEQUENCES = "polar:split_token_sequences"
UNEXPLAINED_SEGMENT = "polar:unexplained_segment"
SPANS_POLICY_UPDATE = "polar:spans_policy_update"
NO_MODEL_CALLS = "polar:no_model_calls"


def _segmented(
    settled: Settled, answered: Sequence[CallJSON], all_chains: bool
) -> tuple[list[CallJSON], list[CallJSON], dict[str, Any], str | None]:
    """(the calls answered, the main segment's calls for ``response``, the ``training_traces`` envelope, why the
    sample is split where a segment's calls are not one sequence): the trainable segments (every one with
    ``all_chains``), or the main one alone when the sample is masked."""
    by_id = {call["call_id"]: call for call in answered}
    root = next((s for s in settled.segments if s.edge is None), settled.segments[0])
    chosen = [s for s in settled.segments if all_chains or s.trainable] if settled.masked is None else [root]
    order = {call["call_id"]: position for position, call in enumerate(answered)}
    chosen = [SegmentCalls(s.index, s.edge, s.parent, s.trainable, tuple(sorted(
        (c for c in s.call_ids if c in by_id), key=order.__getitem__)), s.masked) for s in chosen]  # fmt: skip
    chosen = [s for s in chosen if s.call_ids]
    main = next((s for s in chosen if s.index == root.index), chosen[0] if chosen else None)
    kept = [by_id[c] for c in main.call_ids] if main else []
    delivered = [by_id[c] for s in chosen for c in s.call_ids]
    broken = [s.index for s in chosen if len(sequences([by_id[c] for c in s.call_ids])) > 1]
    split = f"segment(s) {broken} do not form one token sequence each" if broken else None
    return delivered or kept, kept, training_traces(settled.session_id, chosen, by_id), split


def _masks(settled: Settled, kept: Sequence[CallJSON], split: str | None) -> list[tuple[str, str]]:
    """Why the sample's reward does not measure the policy: ``(failure_kind, reason)`` each, most telling first."""
    masks = []
    if settled.state == "cancelled":
        masks.append((CANCELLED, f"the session was cancelled ({settled.error or 'no error recorded'}); a cancelled "
                                 "attempt is never training signal"))  # fmt: skip
    if settled.masked:
        masks.append((UNEXPLAINED_SEGMENT, f"a break no edge explains ({settled.masked}); the main segment is "
                                           "returned"))  # fmt: skip
    spanning = [call for call in kept if call.get("spans_policy_update")]
    if spanning:
        masks.append((SPANS_POLICY_UPDATE, f"{len(spanning)} returned call(s) were sampled across a policy update "
                                           f"({spanning[0].get('policy_version')} -> "
                                           f"{spanning[0].get('policy_version_end')})"))  # fmt: skip
    if split:
        masks.append((SPLIT_SEQUENCES, split))
    if settled.reward is None and settled.state != "cancelled":
        masks.append((VERIFIER_ERROR, f"no evaluator scored it ({settled.error or 'no error recorded'})"))
    return masks


def _degraded(state: str) -> str | None:
    """A scored sample's failure, named but not masked: the harness timed out or failed, and was measured."""
    return {"timed_out": AGENT_TIMEOUT, "failed": AGENT_RUN_ERROR}.get(state)


def reward_components(settled: Settled, reward: float) -> dict[str, float]:
    """The reward's parts, which sum to ``reward``: the evaluator's own ``reward_components`` when its details give
    parts that sum to it, else the one part it gave (named for the evaluator)."""
    given = (settled.evaluation or {}).get("reward_components")
    if isinstance(given, dict) and all(isinstance(v, int | float) and not isinstance(v, bool) for v in given.values()):
        parts = {str(name): float(value) for name, value in given.items()}
        if parts and math.isclose(sum(parts.values()), reward, rel_tol=1e-9, abs_tol=1e-9):
            return parts
    return {settled.evaluator or "reward": reward}


def sequences(calls: Sequence[CallJSON]) -> list[list[CallJSON]]:
    """``calls`` cut where NeMo RL's check would fail: a call whose prompt does not start with every prompt and
    generated token of the call before it starts a new sequence."""
    runs: list[list[CallJSON]] = []
    seen: list[int] = []
    for call in calls:
        prompt = call["prompt_token_ids"]
        if not runs or prompt[: len(seen)] != seen:
            runs.append([])
        runs[-1].append(call)
        seen = prompt + call["completion_token_ids"]
    return runs


def response(calls: Sequence[CallJSON], model: str, session_id: uuid.UUID) -> dict[str, Any]:
    """A Responses-API response (NeMo Gym's ``NeMoGymResponse``) whose output is each call's items, the last of
    each carrying the call's token ids and logprobs."""
    output: list[dict[str, Any]] = []
    for call in calls:
        items = call_items(call)
        items[-1].update(
            prompt_token_ids=call["prompt_token_ids"],
            generation_token_ids=call["completion_token_ids"],
            generation_log_probs=call["logprobs"],
        )
        output += items
    return {
        "id": f"resp_{session_id.hex}",
        "object": "response",
        "created_at": time.time(),
        "model": model,
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "status": "completed",
    }


def call_items(call: CallJSON) -> list[dict[str, Any]]:
    """The output items one call produced: its reasoning, its text, its tool calls (a text item when it produced
    none of them, so the tokens have an item to ride on)."""
    answer = EngineAnswer(call["response"])
    prefix = call["call_id"].replace("-", "")[:24]
    items: list[dict[str, Any]] = []
    if answer.reasoning:
        summary = [{"type": "summary_text", "text": answer.reasoning}]
        items.append({"id": f"rs_{prefix}", "type": "reasoning", "summary": summary})
    if answer.content or not answer.tool_calls:
        text = {"type": "output_text", "text": answer.content, "annotations": []}
        items.append({"id": f"msg_{prefix}", "type": "message", "role": "assistant", "status": "completed",
                      "content": [text]})  # fmt: skip
    for index, tool_call in enumerate(answer.tool_calls):
        function = tool_call.get("function") or {}
        arguments = function.get("arguments")
        items.append({
            "id": f"fc_{prefix}_{index}", "type": "function_call", "status": "completed",
            "call_id": str(tool_call.get("id") or f"call_{prefix}_{index}"), "name": str(function.get("name", "")),
            "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments or {}),
        })  # fmt: skip
    return items


def _error(status: int, message: str, polar: dict[str, Any], kind: str) -> Answer:
    body = {"error": {"message": message, "type": "polar_session"}, "failure_kind": kind, "failure_reason": message,
            "polar": polar}  # fmt: skip
    return Answer(status, body)
