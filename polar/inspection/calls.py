"""A session's captured calls for reading, a page at a time: what the client sent, what the engine got, what came
back, how long it took and how it ended. Payloads are rebuilt from their deltas (``polar.storage.calls.read``);
prompts are not joined (the trajectory viewer shows tokens): only their lengths are shown.
"""

from __future__ import annotations

import uuid
from typing import Any

from polar.clock import iso
from polar.codec.redaction import shown_url
from polar.errors import NotFound
from polar.services import Services
from polar.storage.calls.read import (
    SUMMARY_COLUMNS,
    WholeCall,
    call_place,
    count_calls,
    rebuild,
    seqs_at_offset,
    session_rows,
)
from polar.storage.models import Session


def _summary(call: Any, whole: WholeCall) -> dict[str, Any]:
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
        "policy_version_end": call.policy_version_end,
        "spans_policy_update": bool(call.spans_policy_update),
        "engine_kind": call.engine_kind,
        "created_at": iso(call.created_at),
        "request": whole.request,
        "normalized_request": whole.normalized_request,
        "response": whole.response,
        "media": call.media or [],  # its images (polar.storage.media), the payloads hold references to them
    }


def _whole(db: Any, session_id: uuid.UUID, first_seq: int, last_seq: int) -> list[dict[str, Any]]:
    """Calls ``first_seq`` … ``last_seq`` of the session, their payloads rebuilt (prompts are not needed)."""
    rows = session_rows(db, session_id, up_to_seq=last_seq, columns=SUMMARY_COLUMNS)
    wanted = [row for row in rows if row.seq >= first_seq]
    whole = rebuild(rows, {row.id for row in wanted}, prompts=False)
    return [_summary(row, whole[row.id]) for row in wanted]


def call_page(services: Services, session_id: uuid.UUID, offset: int, limit: int) -> dict[str, Any]:
    """Calls ``offset`` … ``offset + limit`` of the session in ``seq`` order: ``{"items", "total", "next_offset"}``."""
    with services.db.unit() as db:
        if db.get(Session, session_id) is None:
            raise NotFound(f"session {session_id} not found")
        total = count_calls(db, session_id)
        seqs = seqs_at_offset(db, session_id, offset, limit)
        items = _whole(db, session_id, seqs[0], seqs[-1]) if seqs else []
    next_offset = offset + len(items)
    return {"items": items, "total": total, "next_offset": next_offset if next_offset < total else None}


def get_call(services: Services, call_id: uuid.UUID) -> dict[str, Any]:
    """One call, as ``call_page`` shows it."""
    with services.db.unit() as db:
        found = call_place(db, call_id)
        if found is None:
            raise NotFound(f"call {call_id} not found")
        return _whole(db, found.session_id, found.seq, found.seq)[0]
