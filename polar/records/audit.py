"""The audit trail: who submitted, cancelled, paused, resumed or exported, from where, and when.

Rows go to ``audit_log`` (append-only; the ``audit_trail`` view adds the batch each row acted on, docs/sql.md).
An actor is a token's role and a short fingerprint of the token (``admin:1f2e3d4c``), never the token itself: enough
to tell which token acted, and which rotation of it, without storing anything that opens the API. A submission is
recorded in the transaction that stores its batch (``polar.lifecycle.batches``); other actions right after they
took effect, with their outcome in ``detail``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session as DbSession

from polar.storage.database import Database
from polar.storage.models import AuditEvent

FINGERPRINT_CHARS = 8
# Who the audit trail says ended a pause that outlasted POLAR_MAX_PAUSE (the reconciler, on the fleet's behalf).
EXPIRY_ACTOR = "polar:reconciler"


@dataclass(frozen=True)
class Caller:
    """Who is acting: ``actor`` as :func:`actor` builds it, and the address the request came from."""

    actor: str
    remote_addr: str | None = None


def actor(role: str, token: str) -> str:
    """``role:fingerprint``, the fingerprint being the first hex digits of the token's SHA-256."""
    return f"{role}:{hashlib.sha256(token.encode()).hexdigest()[:FINGERPRINT_CHARS]}"


def record(
    db: DbSession, actor: str, action: str, target: str | None, detail: dict[str, Any], remote_addr: str | None
) -> None:
    """Add one audit row in ``db``'s transaction (it lands if and only if the transaction commits)."""
    db.add(AuditEvent(actor=actor, action=action, target=target, detail=detail, remote_addr=remote_addr))


def record_now(database: Database, caller: Caller, action: str, target: str | None, detail: dict[str, Any]) -> None:
    """Add one audit row in a transaction of its own."""
    with database.unit() as db:
        record(db, caller.actor, action, target, detail, caller.remote_addr)
