"""A session's captured calls for reading, a page at a time: what the client sent, what the engine got, what came
back, how long it took and how it ended. Token arrays stay in the database (the trajectory viewer shows tokens);
only their lengths are read.
"""

from __future__ import annotations

import uuid
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import defer

from polar.clock import iso
from polar.errors import NotFound
from polar.redaction import shown_url
from polar.services import Services
from polar.storage.models import ModelCall, Session

_WITHOUT_PROMPT = (defer(ModelCall.prompt_token_ids), defer(ModelCall.logprobs))


def _summary(call: ModelCall) -> dict[str, Any]:
    return {
        "call_id": str(call.id),
        "session_id": str(call.session_id),
        "seq": call.seq,
        "agent": call.agent,
        "provider": call.provider,
        "model": call.model,
        "stream": call.stream,
        "prompt_tokens": call.prompt_len,
        "completion_tokens": len(call.completion_token_ids),
        "finish_reason": call.finish_reason,
        "status_code": call.status_code,
        "latency_ms": call.latency_ms,
        "engine_latency_ms": call.engine_latency_ms,
        "engine_url": shown_url(call.engine_url) if call.engine_url else None,
        "policy_version": call.policy_version,
        "created_at": iso(call.created_at),
        "request": call.request,
        "normalized_request": call.normalized_request,
        "response": call.response,
    }


def call_page(services: Services, session_id: uuid.UUID, offset: int, limit: int) -> dict[str, Any]:
    """Calls ``offset`` … ``offset + limit`` of the session in ``seq`` order: ``{"items", "total", "next_offset"}``."""
    with services.db.unit() as db:
        if db.get(Session, session_id) is None:
            raise NotFound(f"session {session_id} not found")
        in_session = ModelCall.session_id == session_id
        total = int(db.scalar(sa.select(sa.func.count()).select_from(ModelCall).where(in_session)) or 0)
        rows = db.scalars(
            sa.select(ModelCall).options(*_WITHOUT_PROMPT).where(in_session).order_by(ModelCall.seq)
            .limit(limit).offset(offset)
        ).all()  # fmt: skip
        items = [_summary(row) for row in rows]
    next_offset = offset + len(items)
    return {"items": items, "total": total, "next_offset": next_offset if next_offset < total else None}


def get_call(services: Services, call_id: uuid.UUID) -> dict[str, Any]:
    """One call, as ``call_page`` shows it."""
    with services.db.unit() as db:
        row = db.scalars(sa.select(ModelCall).options(*_WITHOUT_PROMPT).where(ModelCall.id == call_id)).first()
        if row is None:
            raise NotFound(f"call {call_id} not found")
        return _summary(row)
