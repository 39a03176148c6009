"""A call over the session's ``max_calls`` under the task's ``over_budget: stop``: answered with a final stop.

By default (``over_budget: refuse``) such a call gets the protocol's 429, which most harnesses take as a crash:
they exit non-zero and their work is graded as a failure of the policy, or not at all. With ``stop`` the proxy
answers instead, in the caller's own protocol, with an assistant turn that calls no tool and ends with the
protocol's normal stop (``stop``, ``end_turn``, ``STOP``, ``completed``), streamed when asked: an agent loop ends
as if the model had finished, and the verifier grades what the harness did within its budget.

The reply is Polar's, not the model's: it is built here as an engine-shaped answer with no tokens, rendered by the
protocol module like any other, and recorded with ``synthesized = true``, which keeps it out of trajectories,
exports, the gym answer and the final message evaluators read. The engine is never asked.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from polar.protocols import ClientRequest, EngineAnswer

STOP_TEXT = "Model call budget reached (max_calls); stopping here."


def stop_answer(request: ClientRequest) -> EngineAnswer:
    """The final stop reply to ``request``, as the engine-shaped answer the protocol modules render."""
    body: dict[str, Any] = {
        "id": f"chatcmpl-polar-budget-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": request.model or "polar",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": STOP_TEXT},
                "logprobs": {"content": []},
                "finish_reason": "stop",
                "stop_reason": None,
                "token_ids": [],
            }
        ],
        "prompt_token_ids": [],
        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
        "polar_synthesized": "over_budget: stop",
    }
    return EngineAnswer(body)
