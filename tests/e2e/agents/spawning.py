"""A harness that hands its work to a sub-agent the way Claude Code's Task tool does: the model calls ``Task`` with a
``prompt``; the harness opens a second conversation (its own system prompt and tools) whose first user message is
that prompt, and returns its last answer as the ``Task`` call's tool result; the parent then answers.

Run by the ``python`` harness as ``tests.e2e.agents.spawning:run``; prints the answer.
"""

from __future__ import annotations

import json
import os
from typing import Any

from openai import OpenAI

from polar.agents.arithmetic import evaluate, format_number
from polar.agents.calculator import TOOLS

PARENT_SYSTEM = "You delegate arithmetic to a sub-agent with the Task tool, then state its answer."
CHILD_SYSTEM = "You are a sub-agent. Use the calculator tool for arithmetic, then state the answer."
TASK_TOOL = {"type": "function", "function": {"name": "Task", "description": "Run a sub-agent on a task.",
             "parameters": {"type": "object", "properties": {"description": {"type": "string"},
                                                             "prompt": {"type": "string"}},
                            "required": ["prompt"]}}}  # fmt: skip


def converse(client: OpenAI, model: str, messages: list[Any], tools: list[Any], max_turns: int = 4) -> str:
    """Ask until the model answers without a tool call (running the calculator and Task tools); the answer."""
    for _ in range(max_turns):
        message = client.chat.completions.create(model=model, messages=messages, tools=tools).choices[0].message  # type: ignore[arg-type]
        messages.append(message.model_dump(exclude_none=True, exclude={"refusal", "annotations", "audio"}))
        if not message.tool_calls:
            return message.content or ""
        for call in message.tool_calls:
            arguments = json.loads(call.function.arguments)  # type: ignore[union-attr]
            if call.function.name == "Task":  # type: ignore[union-attr]
                child = [{"role": "system", "content": CHILD_SYSTEM}, {"role": "user", "content": arguments["prompt"]}]
                result = converse(client, model, child, TOOLS)
            else:
                result = format_number(evaluate(arguments["expression"]))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return ""


def run(instruction: str) -> int:
    client = OpenAI(max_retries=0, timeout=120)
    model = os.environ.get("POLAR_MODEL", "polar-reference")
    messages: list[Any] = [{"role": "system", "content": PARENT_SYSTEM}, {"role": "user", "content": instruction}]
    print(converse(client, model, messages, [TASK_TOOL]))
    return 0
