from __future__ import annotations

from typing import Any

import pytest

from polar.reconstruction.break_reasons import answer_of, explain, messages_of, same_history, tools_of

SYSTEM = {"role": "system", "content": "You are an agent."}
TASK = {"role": "user", "content": "Create hello.txt containing HI"}


def call(n: int, reasoning: str | None = "think") -> dict[str, Any]:
    function = {"name": "bash", "arguments": '{"command": "ls"}'}
    return {"role": "assistant", "content": "", "reasoning": reasoning,
            "tool_calls": [{"id": f"id{n}", "type": "function", "function": function}]}  # fmt: skip


def result(n: int, text: str = "ok") -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": f"id{n}", "content": text}


BEFORE = [SYSTEM, TASK, call(0), result(0), call(1)]  # the chain's last call's messages + its answer


def judged(after: list[dict[str, Any]], reason: str = "diverged", sampled: bool = False, **kw: Any) -> dict[str, Any]:
    return explain({"reason": reason, "position": 7}, BEFORE, after, sampled=sampled, **kw)


def test_a_continuation_without_the_reasoning() -> None:
    after = [SYSTEM, TASK, call(0, None), result(0), call(1, None), result(1)]
    assert judged(after)["reason"] == "reasoning_dropped" and judged(after)["message_index"] == 2


def test_same_messages_different_tokens_inside_a_sampled_turn_is_retokenisation() -> None:
    after = [*BEFORE, result(1)]
    assert judged(after, sampled=True)["reason"] == "retokenized"
    # Outside the model's turns the same messages cannot explain it.
    assert judged(after, sampled=False)["reason"] == "diverged"


def test_rewritten_tool_result_history_and_answer() -> None:
    assert judged([SYSTEM, TASK, call(0), result(0, "OK (trimmed)"), call(1), result(1)])["reason"] == (
        "tool_result_rewritten"
    )
    reminder = {"role": "user", "content": "Create hello.txt containing HI <system-reminder>todo</system-reminder>"}
    rewritten = judged([SYSTEM, reminder, call(0), result(0), call(1), result(1)])
    assert (rewritten["reason"], rewritten["message_index"]) == ("history_rewritten", 1)
    other = {**call(0), "content": "Let me look."}
    assert judged([SYSTEM, TASK, other, result(0), call(1), result(1)])["reason"] == "answer_rewritten"


def test_compaction_and_truncation() -> None:
    summary = {"role": "user", "content": "Summary of the conversation so far: listed files."}
    compacted = judged([SYSTEM, TASK, summary], reason="new_conversation")
    assert (compacted["reason"], compacted["message_index"]) == ("compaction", 2)
    assert judged([SYSTEM, TASK, call(0), result(0)], reason="shorter_prompt")["reason"] == "truncation"


def test_a_new_conversation_stays_one_unless_it_continues_the_chain() -> None:
    title = [{"role": "system", "content": "Write a title."}, {"role": "user", "content": "Create hello.txt ..."}]
    kept = judged(title, reason="new_conversation")
    assert kept["reason"] == "new_conversation" and kept["message_index"] == 0
    assert judged(title, reason="parallel")["reason"] == "parallel"
    new_system = [{"role": "system", "content": "You are an agent. Today is Monday."}, TASK, call(0), result(0),
                  call(1), result(1)]  # fmt: skip
    assert judged(new_system, reason="new_conversation")["reason"] == "history_rewritten"


def test_tools_changed() -> None:
    after = [*BEFORE, result(1)]
    assert judged(after, tools_before=["bash"], tools_after=["bash", "read"])["reason"] == "tools_changed"


@pytest.mark.parametrize("after", [None, [], [{"role": "user", "content": [{"type": "image_url"}]}]])
def test_missing_or_unreadable_messages_keep_the_token_reason(after: Any) -> None:
    assert judged(after) == {"reason": "diverged", "position": 7}


def test_readers_of_stored_bodies() -> None:
    tito = {"prompt": [1, 2], "polar_tito": {"messages": [TASK], "tools": [{"function": {"name": "bash"}}]}}
    assert messages_of(tito) == [TASK] and tools_of(tito) == ["bash"]
    assert messages_of({"messages": [TASK]}) == [TASK] and messages_of({}) is None
    assert answer_of({"choices": [{"message": call(1)}]}) == call(1) and answer_of({}) is None


def test_whitespace_clients_trim_is_no_rewrite() -> None:
    answered = {**call(1, "\nthink\n"), "content": "\n\n"}  # as the engine answers: newlines around the parts
    echoed = {**call(1, None), "content": ""}  # as gemini-cli sends it back
    judgement = explain({"reason": "diverged"}, [SYSTEM, TASK, answered], [SYSTEM, TASK, echoed, result(1)])
    assert judgement["reason"] == "reasoning_dropped"


def test_same_history_ignores_what_the_model_said_only() -> None:
    assert same_history(BEFORE[:4], [SYSTEM, TASK, {**call(0, None), "content": "rewritten"}, result(0)])
    assert not same_history(BEFORE[:4], [SYSTEM, TASK, call(0), result(0, "trimmed")])
    assert not same_history(BEFORE[:4], [SYSTEM, TASK, call(0)])
    assert not same_history(
        BEFORE[:4], [SYSTEM, {"role": "user", "content": [{"type": "image_url"}]}, call(0), result(0)]
    )


def _shot(sha: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": f"data:image/png;polar-media,{sha}"}}


def _look(n: int, *shas: str) -> dict[str, Any]:
    return {"role": "user", "content": [*(_shot(s) for s in shas), {"type": "text", "text": f"screen {n}"}]}


RED, BLUE = "a" * 64, "b" * 64


def test_an_old_screenshot_dropped_or_replaced_is_a_media_break() -> None:
    before = [SYSTEM, TASK, call(0), _look(0, RED), call(1)]
    elided = [SYSTEM, TASK, call(0), {"role": "user", "content": [{"type": "text", "text": "screen 0"}]}, call(1),
              _look(1, BLUE)]  # fmt: skip
    dropped = explain({"reason": "diverged", "position": 7}, before, elided)
    assert dropped["reason"] == "media_dropped" and dropped["message_index"] == 3
    swapped = [SYSTEM, TASK, call(0), _look(0, BLUE), call(1), _look(1, BLUE)]
    changed = explain({"reason": "diverged", "position": 7}, before, swapped)
    assert changed["reason"] == "media_changed" and changed["message_index"] == 3
    # The same images resent: not a media break (the tokens differ for another reason).
    same = explain({"reason": "diverged", "position": 7}, before, [*before, _look(1, BLUE)], sampled=True)
    assert same["reason"] not in {"media_dropped", "media_changed"}
