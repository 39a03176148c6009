"""A settled session as NeMo Gym's answer to ``/run`` (``BaseVerifyResponse``): the row, echoed, plus
``response`` and ``reward``.

NeMo RL trains on the output items that carry ``prompt_token_ids``, ``generation_token_ids`` and
``generation_log_probs`` (the last item of each model call; its reasoning, text and tool calls come before it,
without tokens), and it requires each such item's prompt to start with every token seen before it: the calls must
form one growing sequence. Polar's calls are what the engine served, so the ids and logprobs are the captured
ones. Which answer a session gets:

- its sample settled with a task outcome and its calls form one sequence: 200, the evaluator's reward;
- the calls break into several sequences (a harness that compacted its history or dropped earlier reasoning),
  or the session has no reward (no evaluator scored it): 200 with the sequence that holds the last call and
  ``instance_config.mask_sample: true``, which NeMo RL keeps out of the loss; never a silent 0;
- no model call at all: 422 (the row ran, but there is no sample; NeMo RL treats it as the row's fault);
- the sample's last attempt was lost to the infrastructure: 503, which NeMo RL retries (Polar already retried it
  ``max_attempts`` times).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from polar.protocols._base import EngineAnswer
from polar.serialization import CallJSON


@dataclass(frozen=True)
class Settled:
    """What the waiter saw of a row's sample once its latest attempt ended."""

    session_id: uuid.UUID
    state: str
    outcome_class: str | None
    reward: float | None
    attempt: int
    error: str | None


@dataclass(frozen=True)
class Answer:
    status: int
    body: dict[str, Any]


def gym_answer(row: dict[str, Any], settled: Settled, calls: Sequence[CallJSON], model: str) -> Answer:
    """The ``/run`` answer for ``row`` whose sample settled as ``settled`` with ``calls`` (in ``seq`` order)."""
    polar = {"session_id": str(settled.session_id), "state": settled.state, "attempt": settled.attempt}
    if settled.outcome_class == "infrastructure":
        return _error(503, f"the session's last attempt ({settled.attempt}) was lost to the infrastructure: "
                           f"{settled.error}; send the row again", polar)  # fmt: skip
    delivered = [c for c in calls if c["delivered"] and c["status_code"] == 200 and not c.get("synthesized")]
    if not delivered:
        return _error(422, f"the session ended {settled.state} without a model call, so there is no sample "
                           f"({settled.error or 'no error recorded'})", polar)  # fmt: skip
    runs = sequences(delivered)
    kept = runs[-1]
    reasons = []
    if len(runs) > 1:
        reasons.append(f"its {len(delivered)} calls form {len(runs)} token sequences, not one; the last "
                       f"({len(kept)} calls) is returned")  # fmt: skip
    if settled.reward is None:
        reasons.append("no evaluator scored it")
    body = {
        **row,
        "response": response(kept, model, settled.session_id),
        "reward": float(settled.reward or 0.0),
        "polar": {**polar, "calls": len(delivered), "calls_returned": len(kept)},
    }
    if reasons:
        instance = row.get("instance_config") if isinstance(row.get("instance_config"), dict) else {}
        body["instance_config"] = {**instance, "mask_sample": True}
        body["mask_sample"] = True
        body["polar"]["mask_reason"] = "; ".join(reasons)
    return Answer(200, body)


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


def _error(status: int, message: str, polar: dict[str, Any]) -> Answer:
    return Answer(status, {"error": {"message": message, "type": "polar_session"}, "polar": polar})
