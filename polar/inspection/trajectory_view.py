"""One trajectory as a person reads it: its tokens a page at a time, split where each call's part begins, with
prompt tokens (loss mask 0) and sampled tokens (mask 1) in separate runs and merge breaks marked where they are.

    detail = load_trajectory(services, trajectory_id)
    window = page_window(len(detail.token_ids), number)            # never all 100k tokens at once
    page = trajectory_page(detail, window, texts)                  # texts: token id -> decoded text

Call boundaries come from the calls' rows: call k's part of the trajectory runs from where call k-1's sampled
tokens ended to the end of its own sampled tokens, which start at its full prompt's length (every reconstruction
keeps a call's prompt as the trajectory's prefix). When the rows disagree with the trajectory (a call deleted,
another reconstruction), ``spans`` is None and the page shows mask runs only.

Merge breaks (``polar.reconstruction.prefix_merging``) are recorded in the stats of the trajectory the breaking
call started, with the position where its prompt left the nearest trajectory. Both sides are marked at that
position: the new trajectory ("started here") and the trajectory it left ("left here").
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import defer

from polar.errors import NotFound
from polar.services import Services
from polar.storage.calls.read import span_rows
from polar.storage.models import Session, Trajectory

PAGE_TOKENS = 2000


@dataclass(frozen=True)
class CallSpan:
    call_id: str
    seq: int
    agent: str | None
    finish_reason: str | None
    start: int  # the first token this call added (the prompt tokens after the previous call's)
    sampled_start: int  # its first sampled token
    end: int  # one past its last sampled token


@dataclass(frozen=True)
class BreakMark:
    position: int  # token index in this trajectory
    reason: str
    seq: int | None
    call_id: str | None
    started_here: bool  # the breaking call started this trajectory (else: it left this one here)
    other_id: str | None  # the trajectory on the other side of the break
    other_position: int | None
    expected_token: int | None
    actual_token: int | None


@dataclass(frozen=True)
class TrajectoryDetail:
    trajectory_id: str
    session_id: uuid.UUID
    batch_id: str
    position: int
    agent: str | None
    reconstruction: str
    reward: float | None
    stats: dict[str, Any]
    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    spans: tuple[CallSpan, ...] | None
    breaks: tuple[BreakMark, ...]
    siblings: tuple[tuple[str, int], ...]  # (trajectory id, position) of every trajectory of the session


@dataclass(frozen=True)
class Window:
    number: int  # 1-based
    pages: int
    start: int
    end: int


@dataclass(frozen=True)
class TokenCell:
    index: int
    token_id: int
    text: str | None  # None: not decoded (the engine did not answer)
    sampled: bool
    logprob: float


@dataclass(frozen=True)
class Run:
    sampled: bool
    tokens: tuple[TokenCell, ...]


@dataclass(frozen=True)
class Section:
    """The part of one call's tokens (or, without call boundaries, of the trajectory) on this page."""

    span: CallSpan | None
    number: int | None  # the call's 1-based place in the trajectory
    continued: bool  # it began on an earlier page
    pieces: tuple[Run | BreakMark, ...]


@dataclass(frozen=True)
class TrajectoryPage:
    window: Window
    sections: tuple[Section, ...]
    call_pages: tuple[tuple[CallSpan, int], ...]  # each call and the page its part begins on


def call_spans(loss_mask: Sequence[int], calls: Sequence[Any | None]) -> tuple[CallSpan, ...] | None:
    """Where each call's part lies, from rows with ``id``, ``seq``, ``agent``, ``finish_reason``, ``prompt_len``
    and ``completion_token_ids`` in the trajectory's ``call_ids`` order; None when they do not fit the mask."""
    spans: list[CallSpan] = []
    end = 0
    for call in calls:
        if call is None:
            return None
        sampled_start = int(call.prompt_len)
        sampled_end = sampled_start + len(call.completion_token_ids)
        if sampled_start < end or sampled_end > len(loss_mask):
            return None
        if any(mask != 1 for mask in loss_mask[sampled_start:sampled_end]):
            return None
        spans.append(CallSpan(str(call.id), call.seq, call.agent, call.finish_reason, end, sampled_start, sampled_end))
        end = sampled_end
    return tuple(spans) if end == len(loss_mask) else None


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _mark(record: Any, started_here: bool, other: tuple[str, int] | None, total: int) -> BreakMark | None:
    if not isinstance(record, dict) or _int_or_none(record.get("position")) is None:
        return None
    return BreakMark(
        position=min(max(record["position"], 0), max(total - 1, 0)),
        reason=str(record.get("reason") or "unknown"),
        seq=_int_or_none(record.get("seq")),
        call_id=str(record["call_id"]) if record.get("call_id") else None,
        started_here=started_here,
        other_id=other[0] if other else None,
        other_position=other[1] if other else None,
        expected_token=_int_or_none(record.get("expected_token")),
        actual_token=_int_or_none(record.get("actual_token")),
    )


def _breaks(row: Trajectory, siblings: Sequence[Any]) -> tuple[BreakMark, ...]:
    by_position = {sibling.position: (str(sibling.id), sibling.position) for sibling in siblings}
    total = len(row.token_ids)
    marks: list[BreakMark | None] = []
    for record in (row.stats or {}).get("breaks") or []:
        index = record.get("trajectory_index") if isinstance(record, dict) else None
        marks.append(_mark(record, True, by_position.get(index), total))
    for sibling in siblings:
        if sibling.id == row.id:
            continue
        for record in (sibling.stats or {}).get("breaks") or []:
            if isinstance(record, dict) and record.get("trajectory_index") == row.position:
                marks.append(_mark(record, False, (str(sibling.id), sibling.position), total))
    return tuple(sorted((m for m in marks if m is not None), key=lambda m: (m.position, m.seq or 0)))


def _uuids(values: Sequence[str]) -> list[uuid.UUID] | None:
    try:
        return [uuid.UUID(str(value)) for value in values]
    except ValueError:
        return None


def load_trajectory(services: Services, trajectory_id: uuid.UUID) -> TrajectoryDetail:
    with services.db.unit() as db:
        row = db.get(Trajectory, trajectory_id)
        if row is None:
            raise NotFound(f"trajectory {trajectory_id} not found")
        batch_id = db.scalar(sa.select(Session.batch_id).where(Session.id == row.session_id))
        call_ids = _uuids(row.call_ids)
        calls = span_rows(db, call_ids or [])
        siblings = db.execute(
            sa.select(Trajectory.id, Trajectory.position, Trajectory.stats)
            .where(Trajectory.session_id == row.session_id)
            .order_by(Trajectory.position)
        ).all()
        by_id = {call.id: call for call in calls}
        spans = call_spans(row.loss_mask, [by_id.get(c) for c in call_ids]) if call_ids is not None else None
        return TrajectoryDetail(
            trajectory_id=str(row.id),
            session_id=row.session_id,
            batch_id=str(batch_id),
            position=row.position,
            agent=row.agent,
            reconstruction=row.reconstruction,
            reward=row.reward,
            stats=dict(row.stats or {}),
            token_ids=list(row.token_ids),
            loss_mask=list(row.loss_mask),
            logprobs=list(row.logprobs),
            spans=spans,
            breaks=_breaks(row, siblings),
            siblings=tuple((str(s.id), s.position) for s in siblings),
        )


def trajectory_summaries(services: Services, session_id: uuid.UUID) -> list[dict[str, Any]]:
    """The session's trajectories without their arrays: id, position, agent, reconstruction, reward, stats, and
    ``num_tokens`` (from the stats both reconstructions keep)."""
    with services.db.unit() as db:
        rows = db.scalars(
            sa.select(Trajectory)
            .options(defer(Trajectory.token_ids), defer(Trajectory.loss_mask), defer(Trajectory.logprobs))
            .where(Trajectory.session_id == session_id)
            .order_by(Trajectory.position)
        ).all()
        return [
            {
                "trajectory_id": str(row.id),
                "position": row.position,
                "agent": row.agent,
                "reconstruction": row.reconstruction,
                "reward": row.reward,
                "stats": row.stats or {},
                "segment": row.segment,
                "num_tokens": int((row.stats or {}).get("prompt_tokens") or 0)
                + int((row.stats or {}).get("completion_tokens") or 0),
            }
            for row in rows
        ]


def segment_tree(summaries: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The session's segments as a tree for the console (``trajectory_summaries``' rows): each node its ``index``,
    ``edge``, ``parent``, ``trainable``, ``calls`` and ``sampled`` (summed over its rows: a per-request session has
    one per call), the first row's ``trajectory_id``, and its ``children`` in index order (a side call under the
    segment it was made beside). Empty when no row has a segment (stored before segments)."""
    nodes: dict[int, dict[str, Any]] = {}
    for row in summaries:
        segment = row.get("segment")
        if not segment:
            continue
        stats = row.get("stats") or {}
        node = nodes.setdefault(int(segment["index"]), {
            "index": int(segment["index"]), "edge": segment.get("edge"), "parent": segment.get("parent"),
            "trainable": bool(segment.get("trainable")), "trajectory_id": row["trajectory_id"], "calls": 0,
            "sampled": 0, "children": [],
        })  # fmt: skip
        node["calls"] += int(stats.get("num_calls") or 1)
        node["sampled"] += int(stats.get("completion_tokens") or 0)
    tops = []
    for index in sorted(nodes):
        node = nodes[index]
        parent = nodes.get(node["parent"]) if node["parent"] is not None else None
        (parent["children"] if parent is not None and parent is not node else tops).append(node)
    return tops


def page_window(total: int, number: int, size: int = PAGE_TOKENS) -> Window:
    """Page ``number`` (1-based, clamped to the pages there are) of ``total`` tokens, ``size`` per page."""
    pages = max(math.ceil(total / size), 1)
    number = min(max(number, 1), pages)
    start = (number - 1) * size
    return Window(number, pages, start, min(start + size, total))


def _pieces(detail: TrajectoryDetail, start: int, end: int, texts: Mapping[int, str]) -> tuple[Run | BreakMark, ...]:
    marks = [mark for mark in detail.breaks if start <= mark.position < end]
    pieces: list[Run | BreakMark] = []
    run: list[TokenCell] = []
    for index in range(start, end):
        sampled = detail.loss_mask[index] == 1
        while marks and marks[0].position == index:
            if run:
                pieces.append(Run(run[0].sampled, tuple(run)))
                run = []
            pieces.append(marks.pop(0))
        if run and run[0].sampled != sampled:
            pieces.append(Run(run[0].sampled, tuple(run)))
            run = []
        token = detail.token_ids[index]
        logprob = detail.logprobs[index] if index < len(detail.logprobs) else 0.0
        run.append(TokenCell(index, token, texts.get(token), sampled, logprob))
    if run:
        pieces.append(Run(run[0].sampled, tuple(run)))
    return tuple(pieces)


def trajectory_page(
    detail: TrajectoryDetail, window: Window, texts: Mapping[int, str], size: int = PAGE_TOKENS
) -> TrajectoryPage:
    """The sections of ``window``: one per call whose part lies (partly) on it, or one for the whole window when
    the trajectory has no call boundaries. ``size`` must be the one ``window`` was cut with."""
    sections: list[Section] = []
    if detail.spans is None:
        if window.end > window.start:
            pieces = _pieces(detail, window.start, window.end, texts)
            sections.append(Section(None, None, window.start > 0, pieces))
        call_pages: tuple[tuple[CallSpan, int], ...] = ()
    else:
        for number, span in enumerate(detail.spans, 1):
            start, end = max(span.start, window.start), min(span.end, window.end)
            if start < end:
                pieces = _pieces(detail, start, end, texts)
                sections.append(Section(span, number, span.start < window.start, pieces))
        call_pages = tuple((span, span.start // size + 1) for span in detail.spans)
    return TrajectoryPage(window, tuple(sections), call_pages)
