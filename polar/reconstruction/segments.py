"""A session as one rollout in segments: each trajectory is a segment, and every segment but the root has one typed
parent edge that says where it came from (DESIGN.md §5; docs/training-data.md, "Segments").

    found = segments(trajectories, calls, texts)      # trajectories: prefix-merged, breaks explained, main set
    found[i].edge, found[i].parent, found[i].trainable

Each trajectory takes the first edge whose evidence holds, or none when it opens a conversation of its own. The
root is the one of those the session's longest main-agent trajectory (``longest``) descends from; the
other conversations of their own are side calls or unexplained. The edges:

- ``fork``: it branches at a call boundary of the nearest trajectory (the break's ``boundary``: a resample of a
  call's prompt, or another continuation after a call's sampled tokens, whatever the messages say changed after
  them, kept as ``evidence.reason``): ``parent`` the nearest trajectory, ``call_id`` that call. Tested first: a
  branch repeats its parent's opening, summary and spawn prompt as they were.
- ``spawn``: the segment's first user message (or one of its text parts) is a string argument of a tool call
  sampled earlier in another segment (a Task/Agent/task tool's ``prompt``): ``parent`` is that segment, ``call_id``
  the call, ``tool_call_id`` the tool call; ``evidence.returned`` says whether its conversation's last answer (in it
  or in the segments it went on in) came back in that tool call's result.
- ``compaction``: its first prompt holds text sampled earlier in another segment (the summary, in a user message or
  an assistant turn; or, for a summariser sent the conversation serialised, its earlier answers and tool calls):
  ``parent`` is that segment and ``call_id`` the latest such call.
- ``rewrite``: the break, inside sampled tokens or the opening, is explained from the messages (``break_reasons``: a
  rewritten answer or history, dropped reasoning, re-tokenisation, changed tools).
- ``side``: a conversation of its own whose answers never reappear in a later prompt (a title request, a
  classifier): not trainable, nor is what branches off it.
- ``unexplained``: nothing above holds. Trainable under ``lenient``; under ``strict`` (the default) the whole
  sample is masked (``masked``), as NeMo RL holds: an undeclared discontinuity is an error, never a compaction.

Evidence reads text, not tokens, and only what postrun loads for it (``polar.stages.segments``): every call's answer,
and the prompt messages of each segment's first and last call (the last holds all its conversation's tool results).
A session of one trajectory is its root and reads nothing. The loss mask already gives every sampled token one
owner (a later segment repeats an earlier one's tokens as context, mask 0); segments say how they relate.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from polar.reconstruction.base import CapturedCall, TrajectoryData
from polar.reconstruction.break_reasons import NEW_CHAIN, UNEXPLAINED

Mode = Literal["strict", "lenient"]
# What sub-agent tools call their task: Claude Code's Agent, opencode's task, Gemini's invoke_agent and Qwen's agent
# ``prompt``, Codex's spawn_agent ``message``, cline's spawn_agent ``task``.
PROMPT_ARGUMENTS = frozenset({"prompt", "message", "task"})
_MIN_ARGUMENT = 16  # a tool argument shorter than this is too common to prove a spawn
_MIN_LINE = 24  # lines of an answer shorter than this are not matched on their own
_MIN_REUSED = 48  # characters of an earlier answer a prompt must hold to reuse it
# How many of the latest earlier calls a conversation of its own is matched against: the Task call that opened a
# sub-agent and the summary a compaction reuses come just before it; this bounds a long session's postrun.
_LOOKBACK = 256


@dataclass(frozen=True)
class CallText:
    """What evidence reads of one call: its prompt's chat messages (loaded for a segment's first and last call
    only) and its answer (the assistant message)."""

    messages: Sequence[Mapping[str, Any]] | None = None
    answer: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Segment:
    index: int
    edge: str | None  # None for the root
    parent: int | None
    call_id: str | None  # the parent's call it came from
    tool_call_id: str | None = None  # for a spawn: the parent's tool call that opened it
    evidence: dict[str, Any] = field(default_factory=dict)
    trainable: bool = True

    def as_json(self) -> dict[str, Any]:
        return {"index": self.index, "edge": self.edge, "parent": self.parent, "call_id": self.call_id,
                "tool_call_id": self.tool_call_id, "evidence": self.evidence, "trainable": self.trainable}  # fmt: skip


def longest(trajectories: Sequence[TrajectoryData]) -> int:
    """The main agent's (the first trajectory's agent) longest trajectory, the first created among equals."""
    agent = trajectories[0].agent
    return max((i for i, t in enumerate(trajectories) if t.agent == agent),
               key=lambda i: (len(trajectories[i].token_ids), -i))  # fmt: skip


def needs_text(trajectories: Sequence[TrajectoryData]) -> bool:
    """Whether judging the segments reads any call's text (only when there is more than one trajectory)."""
    return len(trajectories) > 1


def loaded_prompts(trajectories: Sequence[TrajectoryData]) -> set[str]:
    """The calls whose prompt messages evidence reads: each trajectory's first and last."""
    return {call_id for t in trajectories if t.call_ids for call_id in (t.call_ids[0], t.call_ids[-1])}


def segments(
    trajectories: Sequence[TrajectoryData],
    calls: Sequence[CapturedCall],
    texts: Mapping[str, CallText],
    mode: Mode = "strict",
) -> list[Segment]:
    """One segment per trajectory, in the same order."""
    if not trajectories:
        return []
    seqs = {call.call_id: call.seq for call in calls}
    owner = {call_id: index for index, t in enumerate(trajectories) for call_id in t.call_ids}
    found = [_judge(index, trajectories, seqs, owner, texts) for index in range(len(trajectories))]
    root = longest(trajectories)
    while found[root].parent is not None:  # parents are always created earlier: this ends
        root = found[root].parent
    found = [_own(s, root, trajectories, seqs, texts) for s in found]
    found = [_with_return(s, found, trajectories, seqs, texts) if s.edge == "spawn" else s for s in found]
    for position, segment in enumerate(found):  # what branches off a side call is one too (parents come first)
        if segment.parent is not None and segment.parent < position and not found[segment.parent].trainable:
            found[position] = replace(segment, trainable=False)
    if mode == "strict" and any(s.edge == "unexplained" for s in found):
        unexplained = [s.index for s in found if s.edge == "unexplained"]
        masked = {"masked": f"strict: segment(s) {unexplained} have no explained edge"}
        return [replace(s, evidence={**s.evidence, **masked}, trainable=False) for s in found]
    return found


def _judge(
    index: int,
    trajectories: Sequence[TrajectoryData],
    seqs: Mapping[str, int],
    owner: Mapping[str, int],
    texts: Mapping[str, CallText],
) -> Segment:
    """The edge evidence gives ``trajectories[index]``; edge and parent None when it opens a conversation of its
    own (``_own`` then tells the root from side calls)."""
    trajectory = trajectories[index]
    first = trajectory.call_ids[0]
    record = (trajectory.stats.get("breaks") or [None])[0]
    reason = record.get("reason") if record else None
    facts = {k: record[k] for k in ("reason", "detail", "position", "message_index") if record and k in record}
    boundary = record.get("boundary") if record else None
    if boundary:
        return Segment(index, "fork", record["trajectory_index"], boundary["call_id"], None,
                       {**facts, "at": boundary["at"]})  # fmt: skip
    if record is not None and reason not in NEW_CHAIN | UNEXPLAINED | {"compaction"} and _related(record, trajectories):
        # It shares its nearest trajectory's opening and the messages explain it: a rewrite, even if its prompt holds
        # a summary (a compacted conversation whose answer the harness rewrote).
        nearest = record["trajectory_index"]
        return Segment(index, "rewrite", nearest, _last_before(trajectories[nearest], seqs, seqs[first]), None, facts)
    opening = texts.get(first, CallText()).messages
    earlier = sorted((c for c in seqs if seqs[c] < seqs[first] and owner.get(c, index) != index),
                     key=lambda c: seqs[c], reverse=True)[:_LOOKBACK]  # fmt: skip
    spawned = _spawn(index, trajectory, opening, earlier, owner, trajectories, texts) if opening else None
    if spawned is not None:
        return spawned
    summary = _summary(opening, earlier, texts) if opening else None
    if summary is not None:
        call_id, chars = summary
        return Segment(index, "compaction", owner[call_id], call_id, None, {"summary_call": call_id,
                                                                            "summary_chars": chars})  # fmt: skip
    if record is None or reason in NEW_CHAIN:
        return Segment(index, None, None, None, None, facts)
    nearest = record["trajectory_index"]
    previous = _last_before(trajectories[nearest], seqs, seqs[first])
    return Segment(index, "unexplained" if reason in UNEXPLAINED else "rewrite", nearest, previous, None, facts)


def _related(record: Mapping[str, Any], trajectories: Sequence[TrajectoryData]) -> bool:
    """Whether the break's prompt agrees with its nearest trajectory's whole first prompt (shares sampled history)."""
    spans = trajectories[record["trajectory_index"]].stats.get("spans") or []
    return bool(spans) and record["position"] >= spans[0][0]


def _own(
    segment: Segment,
    root: int,
    trajectories: Sequence[TrajectoryData],
    seqs: Mapping[str, int],
    texts: Mapping[str, CallText],
) -> Segment:
    """A conversation of its own that is not the root: a side call when its answers never reappear in a later
    prompt, else unexplained (parent: the trajectory its break names, or the root)."""
    if segment.index == root or segment.edge is not None:
        return segment
    trajectory = trajectories[segment.index]
    record = (trajectory.stats.get("breaks") or [None])[0]
    parent = record["trajectory_index"] if record else root
    previous = _last_before(trajectories[parent], seqs, seqs[trajectory.call_ids[0]])
    if not _reappears(trajectory, trajectories, seqs, texts):
        return replace(segment, edge="side", parent=parent, call_id=previous,
                       evidence={**segment.evidence, "answers_reappear": False}, trainable=False)  # fmt: skip
    return replace(segment, edge="unexplained", parent=parent, call_id=previous,
                   evidence={**segment.evidence, "answers_reappear": True})  # fmt: skip


def _spawn(
    index: int,
    trajectory: TrajectoryData,
    opening: Sequence[Mapping[str, Any]],
    earlier: Sequence[str],
    owner: Mapping[str, int],
    trajectories: Sequence[TrajectoryData],
    texts: Mapping[str, CallText],
) -> Segment | None:
    """A spawn edge when the first user message is a string argument of a tool call sampled earlier (the latest such
    call): the whole message, one of its text parts, or, for an argument named like a sub-agent's task
    (``PROMPT_ARGUMENTS``), held in it (a harness may add its own reminders beside it)."""
    user = next((m.get("content") for m in opening if m.get("role") == "user"), None)
    whole = text_of(user)
    parts = {text.strip() for text in (whole, *_parts(user)) if text.strip()}
    if not parts:
        return None
    for call_id in earlier:
        for tool_call in tool_calls_of(texts.get(call_id, CallText()).answer):
            for name, value in _string_arguments(tool_call):
                if len(value) >= _MIN_ARGUMENT and (value in parts or (name in PROMPT_ARGUMENTS and value in whole)):
                    evidence = {"spawn_call": call_id, "tool": tool_call["name"], "argument": name}
                    return Segment(index, "spawn", owner[call_id], call_id, tool_call["id"], evidence)
    return None


def _parts(content: Any) -> list[str]:
    """The text of each part of a message's content (none for a plain string)."""
    if not isinstance(content, list):
        return []
    return [text_of(part.get("text") if isinstance(part, dict) else part) for part in content]


def _summary(opening: Sequence[Mapping[str, Any]], earlier: Sequence[str],
             texts: Mapping[str, CallText]) -> tuple[str, int] | None:  # fmt: skip
    """The latest earlier call whose sampled text (its answer, reasoning, or a tool call's string argument: a
    summariser may be sent the conversation serialised, tool calls and all) the opening reuses, in any message (only
    a prompt that shares no sampled history with its nearest trajectory is asked: opencode sends its summary back as
    an assistant turn)."""
    told = "\n".join(text_of(m.get("content")) for m in opening)
    for call_id in earlier:
        chars = sum(reused(piece, told) for piece in sampled_texts(texts.get(call_id, CallText()).answer))
        if chars >= _MIN_REUSED:
            return call_id, chars
    return None


def sampled_texts(answer: Mapping[str, Any] | None) -> list[str]:
    """What the model wrote in an answer, piece by piece: its text, its reasoning, its tool calls' string
    arguments."""
    if not answer:
        return []
    pieces = [text_of(answer.get("content")), str(answer.get("reasoning") or answer.get("reasoning_content") or "")]
    pieces += [value for tool_call in tool_calls_of(answer) for _, value in _string_arguments(tool_call)]
    return [piece.strip() for piece in pieces if piece and piece.strip()]


# Edges along which a segment's conversation goes on in another trajectory (a spawn and a side call do not).
GOES_ON = frozenset({"compaction", "fork", "rewrite", "unexplained"})


def _line(start: int, found: Sequence[Segment]) -> list[int]:
    """``start`` and the segments its conversation goes on in (``GOES_ON`` edges, transitively)."""
    line, frontier = [start], [start]
    while frontier:
        at = frontier.pop()
        for segment in found:
            if segment.parent == at and segment.edge in GOES_ON and segment.index not in line:
                line.append(segment.index)
                frontier.append(segment.index)
    return line


def _with_return(
    spawn: Segment,
    found: Sequence[Segment],
    trajectories: Sequence[TrajectoryData],
    seqs: Mapping[str, int],
    texts: Mapping[str, CallText],
) -> Segment:
    """``spawn`` with ``evidence.returned``: whether the sub-agent's last answer (the last call of its conversation,
    which a re-tokenised or compacted turn may have carried into other segments) came back as the parent
    conversation's tool result for the spawning tool call."""
    child = [c for i in _line(spawn.index, found) for c in trajectories[i].call_ids]
    last = max(child, key=seqs.__getitem__)
    answer = text_of((texts.get(last, CallText()).answer or {}).get("content")).strip()
    later = [trajectories[i].call_ids[-1] for i in _line(spawn.parent or 0, found)]  # a spawn always has a parent
    results = [text_of(m.get("content")) for c in later if seqs[c] > seqs[last]
               for m in texts.get(c, CallText()).messages or ()
               if m.get("role") == "tool" and m.get("tool_call_id") == spawn.tool_call_id]  # fmt: skip
    returned = bool(answer) and any(reused(answer, result) or answer in result for result in results)
    return replace(spawn, evidence={**spawn.evidence, "returned": returned})


def _reappears(
    trajectory: TrajectoryData,
    trajectories: Sequence[TrajectoryData],
    seqs: Mapping[str, int],
    texts: Mapping[str, CallText],
) -> bool:
    """Whether any answer of ``trajectory`` is told back in a later loaded prompt (outside assistant turns)."""
    answers = [text_of((texts.get(c, CallText()).answer or {}).get("content")).strip() for c in trajectory.call_ids]
    answers = [a for a in answers if len(a) >= 8]
    last = seqs[trajectory.call_ids[-1]]
    later = [texts[c].messages for t in trajectories if t is not trajectory for c in (t.call_ids[0], t.call_ids[-1])
             if seqs[c] > last and c in texts and texts[c].messages]  # fmt: skip
    told = "\n".join(text_of(m.get("content")) for messages in later for m in messages or ()
                     if m.get("role") != "assistant")  # fmt: skip
    return any(answer in told or reused(answer, told) for answer in answers)


def _last_before(trajectory: TrajectoryData, seqs: Mapping[str, int], seq: int) -> str | None:
    before = [c for c in trajectory.call_ids if seqs[c] < seq]
    return before[-1] if before else None


def reused(sampled: str, text: str) -> int:
    """How many characters of ``sampled`` (an answer) ``text`` holds: all of it, or at least ``_MIN_REUSED`` in its
    lines of ``_MIN_LINE`` characters or more (a harness reformats a summary around them); 0 when it does not."""
    if len(sampled) >= _MIN_LINE and sampled in text:
        return len(sampled)
    lines = {line.strip() for line in sampled.splitlines() if len(line.strip()) >= _MIN_LINE}
    chars = sum(len(line) for line in lines if line in text)
    return chars if chars >= _MIN_REUSED else 0


def text_of(content: Any) -> str:
    """The text of a chat message's content: a string, or its text parts joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(text_of(part.get("text") if isinstance(part, dict) else part) for part in content)
    return ""


def tool_calls_of(answer: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """An answer's tool calls as ``{"id", "name", "arguments"}`` (arguments parsed; ``{}`` where they do not
    parse)."""
    found = []
    for tool_call in (answer or {}).get("tool_calls") or []:
        if not isinstance(tool_call, dict):
            continue
        function = tool_call.get("function") or {}
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                arguments = {}
        found.append({"id": tool_call.get("id"), "name": function.get("name"),
                      "arguments": arguments if isinstance(arguments, dict) else {}})  # fmt: skip
    return found


def _string_arguments(tool_call: Mapping[str, Any]) -> list[tuple[str, str]]:
    return [(str(name), value.strip()) for name, value in tool_call["arguments"].items() if isinstance(value, str)]
