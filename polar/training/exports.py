"""A finished batch as training rows: ``kind="rl"`` (one row per trajectory) or ``kind="sft"`` (one row per
accepted session, as OpenAI-style ``messages`` + ``tools``).

summary = export_summary(services, batch_id, "sft", min_reward=1.0)   # counts, for headers and the CLI
for row in export_rows(services, batch_id, "sft", min_reward=1.0): ...  # streamed from a server-side cursor

Rows come in a stable order (task position, sample index, trajectory position) and have the same keys and types
every time, so ``datasets`` infers one schema without mapping code (``export_formats`` writes JSONL and Parquet):

RL row: ``trajectory_id, session_id, batch_id, task_id`` (str), ``sample_index`` (int), ``group_id`` (str: the
task's ``metadata.group_id``, else ``"<batch_id>:<task position>"``), ``agent`` (str, ``""`` when the call named
no agent), ``token_ids`` (list[int]), ``loss_mask`` (list[int] of 0/1), ``logprobs`` (list[float]), ``reward``
(float or null), ``policy_version`` (str or null: the task's ``metadata.policy_version``, else the version every
call of the session carried), ``num_calls`` (int: calls merged into the trajectory), ``spans_policy_update``
(bool: one of its calls was held by an engine across a weight update, so its sampled tokens came from two
policies; drop or correct it), ``main`` (bool: the session's main chain; false for a side call, a title request,
a tool's own use of the session's key, another agent: ``polar.reconstruction.main_chain``).

SFT row: ``session_id, task_id`` (str), ``sample_index`` (int), ``reward`` (float or null), ``messages`` (list of
``{role, content, reasoning, tool_calls, tool_call_id, name}``: strings, ``""`` when absent, ``tool_calls`` a list
of ``{id, type, function: {name, arguments}}`` with ``arguments`` a JSON string), ``tools`` (list of JSON-encoded
OpenAI tool objects: tool schemas differ too much from task to task for one struct type).

The messages are the main chain's last answered call's ``normalized_request["messages"]`` (what the engine saw)
followed by the assistant message that call returned: a side call made after it (a title request) is never the row.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import sqlalchemy as sa

from polar.contract.states import TERMINAL, State
from polar.errors import NotFound, ValidationError
from polar.lifecycle.attempts import is_training_signal
from polar.lifecycle.groups import group_id
from polar.services import Services
from polar.storage import media
from polar.storage.calls.exports import answer_calls, answer_totals, call_policy_version, spanning_calls, stored_rows
from polar.storage.calls.read import chat_form, rebuild
from polar.storage.columns import array_length
from polar.storage.models import Batch, Session, Task, Trajectory

Kind = Literal["rl", "sft"]
KINDS: tuple[Kind, ...] = ("rl", "sft")
YIELD_PER = 200

IMAGE_PLACEHOLDER = "<image>"  # where an SFT row's message held an image (its ``images`` list them)


@dataclass(frozen=True)
class ExportSummary:
    """What an export holds: sessions considered (RL: terminal; SFT: completed; never an attempt lost to the
    infrastructure), accepted, rows and tokens."""

    kind: Kind
    sessions: int
    accepted: int
    rows: int
    tokens: int

    @property
    def acceptance_rate(self) -> float:
        return round(self.accepted / self.sessions, 6) if self.sessions else 0.0


def check_kind(kind: str) -> Kind:
    if kind not in KINDS:
        raise ValidationError(f"kind: must be one of {', '.join(KINDS)}, got {kind!r}", field="kind")
    return kind


def _considered(kind: Kind) -> list[str]:
    states = TERMINAL if kind == "rl" else {State.COMPLETED}
    return sorted(state.value for state in states)


def _accepted(min_reward: float | None) -> sa.ColumnElement[bool]:
    return Session.reward >= min_reward if min_reward is not None else sa.true()


def _scope(kind: Kind, batch_id: uuid.UUID) -> sa.ColumnElement[bool]:
    # Attempts lost to the infrastructure are never training data (polar.lifecycle.attempts).
    return sa.and_(Session.batch_id == batch_id, Session.state.in_(_considered(kind)), is_training_signal())


def _require_batch(db: Any, batch_id: uuid.UUID) -> None:
    if db.get(Batch, batch_id) is None:
        raise NotFound(f"batch {batch_id} not found")


def export_summary(services: Services, batch_id: uuid.UUID, kind: str, min_reward: float | None) -> ExportSummary:
    """Counts for an export of ``batch_id``; raises ``NotFound`` for an unknown batch."""
    kind = check_kind(kind)
    with services.db.unit() as db:
        _require_batch(db, batch_id)
        scope = _scope(kind, batch_id)
        sessions = db.scalar(sa.select(sa.func.count()).select_from(Session).where(scope)) or 0
        if kind == "rl":
            accepted = db.scalar(sa.select(sa.func.count()).select_from(Session).where(scope, _accepted(min_reward)))
            rows, tokens = db.execute(
                sa.select(sa.func.count(), sa.func.coalesce(sa.func.sum(array_length(db, Trajectory.token_ids)), 0))
                .select_from(Trajectory)
                .join(Session, Session.id == Trajectory.session_id)
                .where(scope, _accepted(min_reward))
            ).one()
        else:
            accepted, tokens = answer_totals(db, batch_id, scope, _accepted(min_reward))
            rows = accepted
    return ExportSummary(kind, int(sessions), int(accepted or 0), int(rows), int(tokens))


def export_rows(
    services: Services, batch_id: uuid.UUID, kind: str, min_reward: float | None
) -> Iterator[dict[str, Any]]:
    """The export's rows, streamed ``YIELD_PER`` at a time; the read transaction stays open while iterating."""
    kind = check_kind(kind)
    with services.db.unit() as db:
        _require_batch(db, batch_id)
        if kind == "rl":
            yield from _rl_rows(db, batch_id, min_reward)
        else:
            yield from _sft_rows(db, batch_id, min_reward)


def _metadata(spec_metadata: Any) -> Mapping[str, Any]:
    return spec_metadata if isinstance(spec_metadata, Mapping) else {}


def _rl_rows(db: Any, batch_id: uuid.UUID, min_reward: float | None) -> Iterator[dict[str, Any]]:
    versions = call_policy_version(batch_id)
    spanning = spanning_calls(db, batch_id)
    query = (
        sa.select(
            Trajectory.id,
            Trajectory.session_id,
            Session.task_id,
            Session.sample_index,
            Task.position,
            Task.spec["metadata"].label("metadata"),
            Trajectory.agent,
            Trajectory.token_ids,
            Trajectory.loss_mask,
            Trajectory.logprobs,
            sa.func.coalesce(Trajectory.reward, Session.reward).label("reward"),
            versions.c.version,
            Trajectory.call_ids,
            Trajectory.main,
            Trajectory.segment,
            Trajectory.media,
        )
        .join(Session, Session.id == Trajectory.session_id)
        .join(Task, Task.id == Session.task_pk)
        .outerjoin(versions, versions.c.session_id == Session.id)
        .where(_scope("rl", batch_id), _accepted(min_reward))
        .order_by(Task.position, Session.sample_index, Trajectory.position, Trajectory.id)
        .execution_options(yield_per=YIELD_PER)
    )
    for row in db.execute(query):
        metadata = _metadata(row.metadata)
        version = metadata.get("policy_version", row.version)
        yield {
            "trajectory_id": str(row.id),
            "session_id": str(row.session_id),
            "batch_id": str(batch_id),
            "task_id": row.task_id,
            "sample_index": row.sample_index,
            "group_id": group_id(batch_id, row.position, metadata),
            "agent": row.agent or "",
            "token_ids": list(row.token_ids),
            "loss_mask": list(row.loss_mask),
            "logprobs": list(row.logprobs),
            "reward": row.reward,
            "policy_version": str(version) if version is not None else None,
            "num_calls": len(row.call_ids),
            # Some of its sampled tokens came from the policy before a weight update: drop or correct it.
            "spans_policy_update": any(str(call_id) in spanning for call_id in row.call_ids),
            # The session's main chain, not a side call (a title request, a tool's own use of the key).
            "main": bool(row.main),
            # Its segment of the session's rollout: one reward, one advantage for all of them (docs/training-data.md).
            "segment": row.segment,
            # Its images' spans in token_ids; each image's bytes: GET /v1/media/{sha256} (docs/training-data.md).
            "media": row.media or [],
        }


def _sft_rows(db: Any, batch_id: uuid.UUID, min_reward: float | None) -> Iterator[dict[str, Any]]:
    sessions = answer_calls(db, batch_id, _scope("sft", batch_id), _accepted(min_reward))
    # A call's payloads are deltas on earlier calls of its session: read each session's calls up to its last.
    for start in range(0, len(sessions), YIELD_PER):
        chunk = sessions[start : start + YIELD_PER]
        stored = stored_rows(db, [session.id for session in chunk])
        by_session: dict[uuid.UUID, list[Any]] = {}
        for row in stored:
            by_session.setdefault(row.session_id, []).append(row)
        for session in chunk:
            rows = [row for row in by_session.get(session.id, []) if row.seq <= session.seq]
            call = rebuild(rows, {session.call_id}, prompts=False)[session.call_id]
            chat = chat_form(call.normalized_request or {})
            shas = media.references(chat.get("messages") or [])
            found = media.load(db.connection(), shas) if shas else {}
            yield {
                "session_id": str(session.id),
                "task_id": session.task_id,
                "sample_index": session.sample_index,
                "reward": session.reward,
                "messages": sft_messages(chat, call.response),
                "tools": [json.dumps(tool, ensure_ascii=False) for tool in chat.get("tools") or []],
                # The conversation's images in order, one per <image> in its messages' text (docs/training-data.md).
                "images": [_image(sha, found.get(sha)) for sha in shas],
            }


def sft_messages(request: Mapping[str, Any], response: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The conversation the engine saw plus the assistant message it answered, in the type-stable message shape."""
    messages = [_message(m) for m in request.get("messages") or [] if isinstance(m, Mapping)]
    choices = response.get("choices") or []
    if choices and isinstance(choices[0].get("message"), Mapping):
        messages.append(_message(choices[0]["message"]))
    return messages


def _image(sha256: str, found: media.StoredImage | None) -> dict[str, Any]:
    """An SFT row's image: its sha256, media type and bytes as base64 (null when it is no longer stored)."""
    if found is None:
        return {"sha256": sha256, "media_type": None, "data": None}
    return {"sha256": sha256, "media_type": found.media_type, "data": base64.b64encode(found.data).decode("ascii")}


def _text(content: Any) -> str:
    """Message content as one string: OpenAI content parts are joined by their text, an image part is ``<image>``
    where it stood (the row's ``images`` hold them in order), other parts are dropped."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            IMAGE_PLACEHOLDER if p.get("type") == "image_url" else str(p.get("text", ""))
            for p in content
            if isinstance(p, Mapping) and ("text" in p or p.get("type") == "image_url")
        )
    return json.dumps(content, ensure_ascii=False)


def _tool_call(call: Mapping[str, Any]) -> dict[str, Any]:
    function = call.get("function") or {}
    arguments = function.get("arguments")
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments if arguments is not None else {}, ensure_ascii=False)
    return {
        "id": str(call.get("id") or ""),
        "type": str(call.get("type") or "function"),
        "function": {"name": str(function.get("name") or ""), "arguments": arguments},
    }


def _message(message: Mapping[str, Any]) -> dict[str, Any]:
    reasoning = message.get("reasoning")
    if reasoning is None:
        reasoning = message.get("reasoning_content")
    shaped = {
        "role": str(message.get("role") or ""),
        "content": _text(message.get("content")),
        "reasoning": _text(reasoning),
        "tool_calls": [_tool_call(c) for c in message.get("tool_calls") or [] if isinstance(c, Mapping)],
        "tool_call_id": str(message.get("tool_call_id") or ""),
        "name": str(message.get("name") or ""),
    }
    return shaped
