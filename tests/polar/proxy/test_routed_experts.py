"""vLLM's per-token expert routing (``routed_experts``, mixture-of-experts models, for routing-replay training):
read from the answer, kept once as bytes in ``model_calls.routed_experts`` (not as megabytes of base64 inside the
stored answer), hidden from the harness, and served with the call and with every trajectory that holds the call."""

from __future__ import annotations

import base64
import io
import uuid
from pathlib import Path

import numpy as np
import pytest

from polar.lifecycle.sessions import session_calls, session_trajectories
from polar.protocols import EngineAnswer, RequestContext, openai_chat, without_routed_experts
from polar.services import Services
from polar.storage.calls.write import CallRecord, record_call
from polar.storage.models import Trajectory
from tests.polar.storage.test_prompts import running_session
from tests.stage_calls import domain_services

PROMPT, COMPLETION = [11, 12, 13, 14], [21, 22, 23]
# (prompt + completion - 1 tokens, 2 layers, 4 experts per token): the shape vLLM 0.32 documents.
ROUTING = np.arange(6 * 2 * 4, dtype=np.uint8).reshape(6, 2, 4)


def _npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def answer_body(routed: str | None) -> dict:
    """A vLLM 0.32 chat answer (the fields Polar reads), with ``routed_experts`` as vLLM sends it."""
    logprobs = {"content": [{"token": "x", "logprob": -0.1, "top_logprobs": []}] * 3}
    choice = {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop",
              "token_ids": COMPLETION, "logprobs": logprobs, "routed_experts": routed}  # fmt: skip
    usage = {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7}
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m", "choices": [choice],
            "usage": usage, "prompt_token_ids": PROMPT}  # fmt: skip


def test_the_answer_yields_the_npy_bytes_and_is_stored_without_the_base64() -> None:
    encoded = base64.b64encode(_npy(ROUTING)).decode()
    body = answer_body(encoded)
    assert EngineAnswer(body).routed_experts == _npy(ROUTING)
    stored = without_routed_experts(body)
    assert encoded not in str(stored) and "model_calls.routed_experts" in stored["choices"][0]["routed_experts"]
    assert body["choices"][0]["routed_experts"] == encoded  # the engine's answer itself is untouched
    assert EngineAnswer(stored).routed_experts is None  # the marker is not mistaken for routing
    assert without_routed_experts(answer_body(None)) == answer_body(None)
    assert EngineAnswer(answer_body(None)).routed_experts is None
    assert EngineAnswer(answer_body("not base64 !")).routed_experts is None


def test_the_harness_never_sees_it() -> None:
    request = openai_chat.normalize({"model": "m", "messages": [{"role": "user", "content": "q"}]}, RequestContext())
    body = answer_body(base64.b64encode(_npy(ROUTING)).decode())
    assert "routed_experts" not in openai_chat.render_response(request, EngineAnswer(body))["choices"][0]


@pytest.fixture
def services(database_url: str, tmp_path: Path) -> Services:
    return domain_services(database_url, tmp_path)


def _record(services: Services, session_id: uuid.UUID, routed: bytes | None) -> uuid.UUID:
    return record_call(
        services.db,
        CallRecord(
            session_id=session_id, agent=None, provider="openai_chat", model="m", stream=False,
            prompt_token_ids=PROMPT, completion_token_ids=COMPLETION, logprobs=[-0.1] * 3, finish_reason="stop",
            status_code=200, latency_ms=1.0, engine_latency_ms=None, engine_url=None, policy_version=None,
            request={}, normalized_request={}, response=without_routed_experts(answer_body(None)),
            routed_experts=routed,
        ),
    )  # fmt: skip


def test_stored_once_and_served_with_the_call_and_its_trajectory(services: Services) -> None:
    session_id = running_session(services)
    routed_call = _record(services, session_id, _npy(ROUTING))
    dense_call = _record(services, session_id, None)
    with services.db.unit() as db:
        for position, call_id in enumerate((routed_call, dense_call)):
            db.add(Trajectory(session_id=session_id, position=position, agent=None, reconstruction="per_request",
                              token_ids=PROMPT + COMPLETION, loss_mask=[0] * 4 + [1] * 3, logprobs=[0.0] * 7,
                              call_ids=[call_id], reward=None, stats={}))  # fmt: skip
    calls = {call["call_id"]: call for call in session_calls(services, session_id)}
    assert calls[str(dense_call)]["routed_experts"] is None
    served = calls[str(routed_call)]["routed_experts"]
    assert served is not None
    routing = np.load(io.BytesIO(base64.b64decode(served)))
    assert routing.shape == (len(PROMPT) + len(COMPLETION) - 1, 2, 4) and (routing == ROUTING).all()
    routed, dense = session_trajectories(services, session_id)
    assert routed["routed_experts"] == [served] and dense["routed_experts"] is None
