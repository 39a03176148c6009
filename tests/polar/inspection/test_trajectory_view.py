"""Cutting a trajectory into pages: call boundaries from the calls' rows, mask runs, break marks on both sides."""

from __future__ import annotations

import uuid
from types import SimpleNamespace

from polar.inspection.trajectory_view import (
    BreakMark,
    CallSpan,
    Run,
    TrajectoryDetail,
    _breaks,
    call_spans,
    page_window,
    segment_tree,
    trajectory_page,
)


def call(seq: int, prompt_len: int, completion: int) -> SimpleNamespace:
    return SimpleNamespace(id=f"c{seq}", seq=seq, agent=None, finish_reason="stop", prompt_len=prompt_len,
                           completion_token_ids=[0] * completion)  # fmt: skip


# Call 1: 3 prompt + 2 sampled; call 2: 2 more prompt tokens + 3 sampled.
MASK = [0, 0, 0, 1, 1, 0, 0, 1, 1, 1]
CALLS = [call(1, 3, 2), call(2, 7, 3)]


def detail(spans: tuple[CallSpan, ...] | None, breaks: tuple[BreakMark, ...] = ()) -> TrajectoryDetail:
    return TrajectoryDetail(
        trajectory_id="t", session_id=uuid.uuid4(), batch_id="b", position=0, agent=None,
        reconstruction="prefix_merging", reward=None, stats={}, token_ids=list(range(100, 110)), loss_mask=MASK,
        logprobs=[-0.1 * m for m in MASK], spans=spans, breaks=breaks, siblings=(),
    )  # fmt: skip


def mark(position: int) -> BreakMark:
    return BreakMark(position, "diverged", 3, "c3", False, "t2", 1, 104, 999)


def test_call_spans_follow_the_prompts() -> None:
    spans = call_spans(MASK, CALLS)
    assert spans is not None
    assert [(s.seq, s.start, s.sampled_start, s.end) for s in spans] == [(1, 0, 3, 5), (2, 5, 7, 10)]


def test_call_spans_that_do_not_fit_are_none() -> None:
    assert call_spans(MASK, [CALLS[0], None]) is None  # a call row is gone
    assert call_spans(MASK, [CALLS[0]]) is None  # the calls end before the trajectory does
    assert call_spans(MASK, [call(1, 2, 2), CALLS[1]]) is None  # its sampled tokens are not masked 1
    assert call_spans(MASK, [CALLS[1], CALLS[0]]) is None  # out of order


def test_page_windows_clamp() -> None:
    assert page_window(10, 1, size=4) == page_window(10, 0, size=4)
    assert (page_window(10, 3, size=4).start, page_window(10, 3, size=4).end) == (8, 10)
    assert page_window(10, 9, size=4).number == 3
    assert page_window(0, 1).pages == 1 and page_window(0, 1).end == 0


def test_a_page_splits_calls_into_runs_and_marks_breaks() -> None:
    trajectory = detail(call_spans(MASK, CALLS), (mark(4),))
    texts = {100 + i: f"w{i}" for i in range(10) if i != 6}
    page = trajectory_page(trajectory, page_window(10, 1, size=6), texts, size=6)
    assert [(s.span.seq if s.span else None, s.number, s.continued) for s in page.sections] == [
        (1, 1, False),
        (2, 2, False),
    ]
    first, second = page.sections
    assert [("mark" if isinstance(p, BreakMark) else p.sampled, len(p.tokens) if isinstance(p, Run) else p.position)
            for p in first.pieces] == [(False, 3), (True, 1), ("mark", 4), (True, 1)]  # fmt: skip
    run = second.pieces[0]
    assert isinstance(run, Run) and [t.text for t in run.tokens] == ["w5"]  # the page ends after token 5
    assert [(span.seq, number) for span, number in page.call_pages] == [(1, 1), (2, 1)]

    rest = trajectory_page(trajectory, page_window(10, 2, size=6), texts, size=6)
    (section,) = rest.sections
    assert section.continued and section.number == 2
    cells = [cell for piece in section.pieces if isinstance(piece, Run) for cell in piece.tokens]
    assert [(c.index, c.text, c.sampled) for c in cells] == [(6, None, False), (7, "w7", True), (8, "w8", True),
                                                             (9, "w9", True)]  # fmt: skip


def test_without_boundaries_the_page_is_one_section() -> None:
    page = trajectory_page(detail(None), page_window(10, 1), {})
    (section,) = page.sections
    assert section.span is None and page.call_pages == ()
    assert [(p.sampled, len(p.tokens)) for p in section.pieces if isinstance(p, Run)] == [
        (False, 3),
        (True, 2),
        (False, 2),
        (True, 3),
    ]


def test_breaks_are_marked_on_both_sides() -> None:
    record = {"call_id": "c3", "seq": 3, "reason": "diverged", "position": 4, "expected_token": 104,
              "actual_token": 7, "trajectory_index": 0}  # fmt: skip
    old = SimpleNamespace(id="old", position=0, stats={"breaks": []}, token_ids=list(range(10)))
    new = SimpleNamespace(id="new", position=1, stats={"breaks": [record]}, token_ids=list(range(12)))
    (started,) = _breaks(new, [old, new])
    (left,) = _breaks(old, [old, new])
    assert (started.started_here, started.other_id, started.other_position, started.position) == (True, "old", 0, 4)
    assert (left.started_here, left.other_id, left.other_position, left.reason) == (False, "new", 1, "diverged")
    broken = SimpleNamespace(id="x", position=2, stats={"breaks": [{"reason": "odd"}, "junk"]}, token_ids=[1])
    assert _breaks(broken, [broken]) == ()  # records without a position are skipped, not fatal


def _row(index: int, edge: str | None, parent: int | None, calls: int = 1, sampled: int = 5) -> dict:
    segment = {"index": index, "edge": edge, "parent": parent, "trainable": edge != "side"}
    return {
        "trajectory_id": f"t{index}",
        "segment": segment,
        "stats": {"num_calls": calls, "completion_tokens": sampled},
    }


def test_segment_tree_nests_children_under_their_parents() -> None:
    rows = [_row(0, "side", 1), _row(1, None, None, calls=6), _row(2, "fork", 1), _row(3, "compaction", 2),
            _row(3, "compaction", 2)]  # fmt: skip
    (root,) = segment_tree(rows)
    assert (root["index"], root["edge"], root["calls"]) == (1, None, 6)
    assert [(c["index"], c["edge"]) for c in root["children"]] == [(0, "side"), (2, "fork")]
    (compaction,) = root["children"][1]["children"]
    assert (compaction["calls"], compaction["sampled"], compaction["trajectory_id"]) == (2, 10, "t3")
    assert not root["children"][0]["trainable"]
    assert segment_tree([{"trajectory_id": "t", "segment": None, "stats": {}}]) == []
