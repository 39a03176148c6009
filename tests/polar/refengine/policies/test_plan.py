from __future__ import annotations

from typing import Any

import pytest

from polar.chat.conversation import Message, ToolCall
from polar.refengine.policies import POLICIES, PlanPolicy, PolicyRequest
from polar.refengine.policies.plan import SCRATCH
from tests.polar.refengine.policies.test_tool_user import (
    CLAUDE,
    CODEX,
    GEMINI,
    MSWEA_SYSTEM,
    MSWEA_TASK,
    OPENCODE,
    PI,
    QWEN,
    tool,
)

ASK = "Create hello.txt containing HELLO-123"


def conversation(steps: int) -> tuple[Message, ...]:
    """The task, then ``steps`` tool turns each answered by a tool result."""
    messages = [Message("system", "You are an agent. Working directory: /work/s1"), Message("user", ASK)]
    for step in range(steps):
        messages.append(Message("assistant", "", tool_calls=(ToolCall("Bash", {"command": "x"}, f"c{step}"),)))
        messages.append(Message("tool", "ok", tool_call_id=f"c{step}"))
    return tuple(messages)


def answer(policy: PlanPolicy, tools: tuple[dict[str, Any], ...], steps: int) -> Any:
    return policy.respond(PolicyRequest(messages=conversation(steps), tools=tools))


def test_registered() -> None:
    assert POLICIES["plan"] is PlanPolicy


@pytest.mark.parametrize("tools", [CLAUDE, CODEX, GEMINI, QWEN, OPENCODE, PI], ids=lambda t: t[0]["function"]["name"])
def test_every_step_is_a_call_of_an_offered_tool_then_a_final_answer(tools: tuple[dict[str, Any], ...]) -> None:
    policy = PlanPolicy({"steps": 8})
    names = {t["function"]["name"] for t in tools}
    for step in range(8):
        turn = answer(policy, tools, step)
        assert len(turn.tool_calls) == 1, (step, turn)
        assert turn.tool_calls[0].name in names
        assert turn.reasoning and f"Step {step + 1} of 8" in turn.reasoning
    final = answer(policy, tools, 8)
    assert final.tool_calls == () and final.content == "Done: created hello.txt in 8 steps."


def test_steps_use_the_tool_meant_for_them() -> None:
    calls = [answer(PlanPolicy({"steps": 8}), CLAUDE, step).tool_calls[0] for step in range(8)]
    assert [c.name for c in calls] == ["Write", "Read", "Bash", "Bash", "Write", "Edit", "Read", "Read"]
    assert calls[0].arguments == {"file_path": "/work/s1/hello.txt", "content": "HELLO-123"}
    assert calls[4].arguments["content"] == "draft note 4\n" and calls[4].arguments["file_path"].endswith(SCRATCH)
    assert calls[5].arguments == {"file_path": SCRATCH, "old_string": "draft note 4", "new_string": "revised note 4"}


def test_codex_edits_through_apply_patch_and_reads_through_its_shell() -> None:
    calls = [answer(PlanPolicy({"steps": 7}), CODEX, step).tool_calls[0] for step in range(7)]
    assert calls[1].name == "exec_command" and calls[1].arguments["cmd"] == "cat hello.txt"
    assert calls[5].name == "apply_patch"
    assert calls[5].arguments["input"].splitlines()[1:5] == [
        f"*** Update File: {SCRATCH}", "@@", "-draft note 4", "+revised note 4"
    ]  # fmt: skip


def test_long_outputs_and_no_reasoning() -> None:
    policy = PlanPolicy({"steps": 4, "reasoning": False, "long_output_lines": 5000})
    run = answer(policy, PI, 3)
    assert run.reasoning is None
    assert run.tool_calls[0].name == "bash" and "seq 1 5000" in run.tool_calls[0].arguments["command"]


def test_a_request_without_tools_gets_a_plain_answer() -> None:
    turn = answer(PlanPolicy({}), (), 2)
    assert turn.tool_calls == () and turn.content == "Working on hello.txt."
    assert PlanPolicy({}).respond(PolicyRequest(messages=(Message("user", "hi"),))).content.startswith("Nothing")


def test_a_harness_without_a_fitting_tool_still_finishes() -> None:
    odd = (tool("search_web", {"query": {"type": "string"}}),)
    assert answer(PlanPolicy({"steps": 3}), odd, 0).content.startswith("Done: created hello.txt; no tool fits")


def test_bad_config_is_refused() -> None:
    with pytest.raises(ValueError, match="steps"):
        PlanPolicy({"steps": 0})


def test_a_text_based_harness_gets_the_plan_as_command_blocks_then_the_submit_command() -> None:
    policy = PlanPolicy({"steps": 3})
    messages = [Message("system", MSWEA_SYSTEM), Message("user", MSWEA_TASK)]
    commands = []
    for _ in range(4):
        turn = policy.respond(PolicyRequest(messages=tuple(messages)))
        assert turn.tool_calls == () and turn.content.count("```mswea_bash_command\n") == 1
        commands.append(turn.content.split("```mswea_bash_command\n")[1].split("\n```")[0])
        messages += [Message("assistant", turn.content), Message("user", "<returncode>0</returncode>")]
    assert commands == ["printf '%s' HELLO-123 > hello.txt", "cat hello.txt", "ls -la",
                        "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"]  # fmt: skip
